"""The batch case: aggregate frames per second with 1, 2, 4 and 8 concurrent sequences.

    s2core bench --case batch [--backends numpy,torch] [--types f16,q8_0] [--layers 4]

Each backend and weight type runs in its own process. For each batch size B, B requests
(different prompts of `context` positions, each its own seed, sampled as s2.cpp samples)
go through the real server (s2core.serving.Server, max_sequences=B): the first step admits
them (prefills and first frames); the timed part is every later step, each of which makes
one frame for every request (B Fast-AR rows per codebook, then one Slow-AR call of B rows).
Frames per second = frames made in the timed steps / their wall time, sampling included.
Step time = the median Slow-AR call; fast time = the median Fast-AR part of a frame. The
sizes run in interleaved rounds (1, 2, 4, 8, then 2, 4, 8, 1, ...), so the load of a shared
machine, which drifts, weighs on every size alike; the speedup of a size is the median of its
ratio to the same round's B=1.

A backend whose capabilities say max_batch_sequences = 1 serves the B requests one after
another (the server's fallback): its figures show what batching is worth by contrast.
"""

from __future__ import annotations

import datetime as dt
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np

from s2core.benchmarking.cases import child_main, load_average, run_child, write_case_outputs

SCHEMA = "s2core-bench-batch/1"
BATCH_SIZES = (1, 2, 4, 8)
DEFAULT_TYPES = ("f16", "q8_0")


# ---------------------------------------------------------------------- the child
def frames_config(hp, frames: int) -> dict[str, Any]:
    """GenerationConfig's settings that make a request run exactly `frames` frames after its
    first: <|im_end|> blocked for every frame (the real id, or a text id of a small model)."""
    from s2core.generation.loop import QWEN_IM_END_ID

    im_end = QWEN_IM_END_ID if QWEN_IM_END_ID < hp.vocab_size else hp.semantic_begin_id - 1
    return dict(max_new_tokens=frames + 1, min_tokens_before_end=frames + 1, im_end_id=im_end)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import s2core
    from s2core.generation.loop import GenerationConfig
    from s2core.contract.registry import get_registry
    from s2core.serving import Server
    from s2core.kit.prompts import mixed_prompt

    name = spec["backend"]
    out: dict[str, Any] = {"backend": name, "weight_type": spec["weight_type"], "status": "ok",
                           "sizes": []}
    try:
        get_registry().backend_class(name)
        model = s2core.load(spec["path"], backend=name)
        caps = model.capabilities
        out["max_batch_sequences"] = caps.max_batch_sequences
        hp = model.hparams
        frames = spec["frames"]
        config = frames_config(hp, frames)
        rng = np.random.default_rng(spec["seed"])
        prompts = [mixed_prompt(hp, spec["context"], rng) for _ in range(max(spec["sizes"]))]

        def run(b: int) -> dict[str, Any]:
            with Server(model, max_sequences=min(b, caps.max_batch_sequences)) as server:
                reqs = [server.submit(prompts[i], GenerationConfig(seed=i, **config))
                        for i in range(b)]
                server.step()  # admission: prefills and every request's first frame
                made = sum(len(r.frames) for r in reqs)
                server.step_times.clear()
                t0 = time.perf_counter()
                server.run()
                wall = time.perf_counter() - t0
                made = sum(len(r.frames) for r in reqs) - made
                steps = [dt for n, dt in server.step_times if n == min(b, server.max_sequences)]
                fast = [s for r in reqs for s in r.stats.fast_decode_s[1:]]
                return {"sequences": b, "frames": made, "wall_s": wall,
                        "frames_per_s": made / wall,
                        "step_ms": float(np.median(steps)) * 1e3 if steps else None,
                        "fast_ms": float(np.median(fast)) * 1e3 if fast else None,
                        "sequences_per_call": min(b, caps.max_batch_sequences)}

        run(1)  # warm-up: first touch of weights and buffers, kernel compilation
        # Rounds, each running every batch size (in a rotated order): on a shared machine the
        # neighbours' load drifts by 2x within minutes, and a drift then hits every size alike.
        # A size's speedup is the median over rounds of its frames/s over the same round's B=1.
        runs: dict[int, list[dict[str, Any]]] = {b: [] for b in spec["sizes"]}
        started = time.perf_counter()
        for k in range(spec["rounds"]):
            if k and time.perf_counter() - started > spec["budget_s"]:
                out["stopped"] = f"phase budget of {spec['budget_s']:.0f} s spent after {k} rounds"
                break
            sizes = list(spec["sizes"])
            for b in sizes[k % len(sizes):] + sizes[:k % len(sizes)]:
                runs[b].append(run(b))
        for b, rows in runs.items():
            if not rows:
                continue
            row = {"sequences": b, "sequences_per_call": rows[0]["sequences_per_call"],
                   "rounds": len(rows), "frames": sum(r["frames"] for r in rows),
                   "frames_per_s_rounds": [r["frames_per_s"] for r in rows]}
            row["frames_per_s"] = float(np.median(row["frames_per_s_rounds"]))
            row["speedup_rounds"] = [r["frames_per_s"] / one["frames_per_s"]
                                     for r, one in zip(rows, runs[spec["sizes"][0]])]
            row["speedup"] = float(np.median(row["speedup_rounds"]))
            for key in ("step_ms", "fast_ms"):
                values = [r[key] for r in rows if r[key] is not None]
                row[key] = float(np.median(values)) if values else None
            out["sizes"].append(row)
        model.close()
    except BaseException as exc:  # report what was measured, and why the rest was not
        out["status"] = "error"
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    return out


# ---------------------------------------------------------------------- the parent
def run_batch_benchmark(cfg, say: Callable[[str], None], frames: int = 4,
                        context: int = 64, rounds: int = 3,
                        sizes: tuple[int, ...] | None = None) -> dict[str, Any]:
    """sizes: the batch sizes, the first the baseline of the speedups (default BATCH_SIZES;
    1, 2 with --quick)."""
    import s2core
    from s2core.benchmarking import machine
    from s2core.benchmarking.models import prepare_model
    from s2core.benchmarking.runner import child_env, select_backends

    info = machine.describe()
    hp = cfg.hparams()
    sizes = sizes or ((1, 2) if cfg.quick else BATCH_SIZES)
    report: dict[str, Any] = {
        "schema": SCHEMA, "case": "batch",
        "created": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "config": cfg.as_dict(), "machine": info, "model_label": cfg.model_label,
        "machine_tag": machine.machine_tag(info), "results": [], "frames": frames,
        "rounds": 1 if cfg.quick else rounds,
        "context": context, "sizes": list(sizes), "picks": {},
        "load_average_start": list(load_average())}
    for line in machine.summary_lines(info):
        say(line)
    names, skipped = select_backends(cfg.backends)
    report["skipped_backends"] = skipped
    with tempfile.TemporaryDirectory(prefix="s2core-batch-") as tmp:
        for wtype in cfg.types:
            acct = prepare_model(hp, wtype, cfg.seed, 1, cfg.model_dir)
            # what load() picks for this file here, set against the measurements below
            report["picks"][wtype] = s2core.default_backend(str(acct.path))
            for name in names:
                say(f"[{wtype}] {name}: {', '.join(map(str, sizes))} concurrent sequences, "
                    f"in a fresh process ...")
                spec = {"backend": name, "weight_type": wtype, "path": str(acct.path),
                        "sizes": list(sizes), "frames": frames, "context": context,
                        "rounds": 1 if cfg.quick else rounds,
                        "seed": cfg.seed, "budget_s": cfg.phase_budget_s}
                result = run_child("batch", spec, tmp, child_env(cfg.threads), cfg.child_timeout_s)
                if result["status"] == "ok":
                    for row in result["sizes"]:
                        say(f"    B={row['sequences']}: {row['frames_per_s']:.2f} frames/s "
                            f"({row['speedup']:.2f}x), step {_fmt(row['step_ms'])} ms, "
                            f"Fast-AR {_fmt(row['fast_ms'])} ms a frame")
                else:
                    say(f"    FAILED: {result['error']}")
                report["results"].append(result)
    report["load_average_end"] = list(load_average())
    return report


def _fmt(x: float | None) -> str:
    from s2core.benchmarking.chart import _ms
    return "-" if x is None else _ms(x)


# ---------------------------------------------------------------------- output
def table_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"Batch case ({report['model_label']}): B concurrent requests of "
             f"{report['context']}-position prompts through s2core.serving.Server, "
             f"{report['frames']} timed frames each (sampled, every request its own seed), "
             f"{report.get('rounds', 1)} interleaved round(s): medians over rounds; vs B=1 = the "
             "median of each round's ratio to that round's B=1.", "",
             "| type | backend | per call | B | frames/s | vs B=1 | step ms | Fast-AR ms/frame |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        if r["status"] != "ok":
            lines.append(f"| {r['weight_type']} | {r['backend']} | failed: {r['error']} "
                         "| | | | | |")
            continue
        for row in r["sizes"]:
            lines.append(f"| {r['weight_type']} | {r['backend']} | {row['sequences_per_call']} "
                         f"| {row['sequences']} | {row['frames_per_s']:.2f} | "
                         f"{row['speedup']:.2f}x | {_fmt(row['step_ms'])} | "
                         f"{_fmt(row['fast_ms'])} |")
        if r.get("stopped"):
            lines.append(f"| {r['weight_type']} | {r['backend']} | {r['stopped']} | | | | | |")
    lines += choice_lines(report)
    lines += ["", "per call = sequences one backend call evaluates (min(B, the backend's "
              "max_batch_sequences)); step = the Slow-AR call of a step (B rows); Fast-AR = "
              "its ten passes for all B rows.",
              f"Load average at start {report['load_average_start']}, end "
              f"{report['load_average_end']}."]
    return lines


def fastest(report: dict[str, Any], weight_type: str, sequences: int) -> str | None:
    """The measured backend with the most frames/s for this type at this batch size."""
    rows = [(row["frames_per_s"], r["backend"]) for r in report["results"]
            if r["status"] == "ok" and r["weight_type"] == weight_type
            for row in r["sizes"] if row["sequences"] == sequences]
    return max(rows)[1] if len(rows) > 1 else None


def choice_lines(report: dict[str, Any]) -> list[str]:
    """load()'s pick for each type against the fastest measured backend (s2core.runtime.
    selection: a pick the measurements show slower is a bug there)."""
    picks = report.get("picks") or {}
    if not picks:
        return []
    lines = ["", "load()'s pick for each file on this machine, against the fastest measured "
             "(frames/s):", "", "| type | load() picks | " +
             " | ".join(f"fastest at B={b}" for b in report["sizes"]) + " | verdict |",
             "|---|---|" + "---|" * len(report["sizes"]) + "---|"]
    for wtype, pick in picks.items():
        best = [fastest(report, wtype, b) for b in report["sizes"]]
        measured = [b for b in best if b is not None]
        verdict = ("not compared (one backend measured)" if not measured else
                   "the fastest" if all(b == pick for b in measured) else
                   "slower than another: a bug in selection.py")
        lines.append(f"| {wtype} | {pick} | " + " | ".join(b or "-" for b in best)
                     + f" | {verdict} |")
    return lines


def write_chart(report: dict[str, Any], path: Path) -> None:
    ok = [r for r in report["results"] if r["status"] == "ok" and r["sizes"]]
    if not ok:
        return  # nothing measured: no chart
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from s2core.benchmarking.chart import _color, finish_sweep_figure

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    styles = {t: s for t, s in zip(report["config"]["types"], ("-", "--", ":", "-."))}
    for j, r in enumerate(ok):
        xs = [row["sequences"] for row in r["sizes"]]
        label = f"{r['backend']} {r['weight_type']}"
        color, style = _color(r["backend"], j), styles.get(r["weight_type"], "-")
        ax1.plot(xs, [row["frames_per_s"] for row in r["sizes"]], style, marker="o",
                 color=color, label=label)
        steps = [(x, row["step_ms"]) for x, row in zip(xs, r["sizes"]) if row["step_ms"]]
        if steps:
            ax2.plot(*zip(*steps), style, marker="o", color=color, label=label)
    finish_sweep_figure(fig, ((ax1, "Aggregate frames per second", "frames/s"),
                              (ax2, "Slow-AR step time (one call, B rows)", "ms")),
                        report["sizes"], "concurrent sequences B",
                        f"s2core bench --case batch: {report['model_label']}; "
                        f"{report['machine_tag']}", path)


def write_outputs(report: dict[str, Any], out_dir: Path) -> int:
    return write_case_outputs("batch", report, out_dir, table_lines(report), write_chart)


def main(argv: list[str] | None = None) -> int:
    return child_main(measure, argv)


if __name__ == "__main__":
    sys.exit(main())
