"""The http case: 1, 4 and 16 concurrent streaming clients over real HTTP against in-process
generation of the same requests.

    s2core bench --case http [--backends numpy] [--types q8_0] [--layers 4]

Each backend and weight type runs in its own process. The requests are N different texts,
each with its own seed, sampled as s2.cpp samples. For each N (in interleaved rounds, so a
shared machine's drifting load weighs on every N alike):
- in process, codes only: `generate_many` on the N prompts (the serving floor);
- in process, with audio: the same, each frame pushed through its request's streaming
  decoder (`AudioOut`) as it comes, as the server does;
- over HTTP: N clients (threads with httpx) POST /v1/audio/speech with stream_format audio
  and response_format pcm to `s2core serve`'s app on a real uvicorn server on 127.0.0.1, at
  once; time to first audio = from a client's request to its first audio byte.
Aggregate frames/s = the frames of the N requests / the wall time from the first request to
the last byte (the same frames on every path: same prompts, same seeds). HTTP overhead =
1 - HTTP frames/s / in-process-with-audio frames/s.

The model has S2 Pro's dimensions (its --layers); the codec is the embedded demo's (S2 Pro's
structure at a width that decodes faster than real time): 2048 samples a frame at 44.1 kHz.
"""

from __future__ import annotations

import datetime as dt
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np

from s2core.benchmarking.cases import child_main, load_average, run_child, write_case_outputs

SCHEMA = "s2core-bench-http/1"
CLIENTS = (1, 4, 16)
DEFAULT_TYPES = ("q8_0",)
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Streaming speech, frame by frame.",
         "Every client gets its own voice and seed.", "A request joins the running batch.",
         "Time to first audio is what people hear.", "Continuous batching shares each step.",
         "The codec decodes as the frames come.", "Nothing waits for the whole sentence."]


# ---------------------------------------------------------------------- the child
def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import httpx

    import s2core
    from s2core.embedded.cache import demo_codec_path
    from s2core.generation.loop import GenerationConfig
    from s2core.http.app import create_app
    from s2core.http.engine import Engine
    from s2core.http.local import local_server
    from s2core.serving import generate_many
    from s2core.speak.audio_out import AudioOut
    from s2core.text.prompt import build_prompt
    from s2core.text.tokenizer import Tokenizer

    name = spec["backend"]
    out: dict[str, Any] = {"backend": name, "weight_type": spec["weight_type"], "status": "ok",
                           "clients": []}
    try:
        tokenizer = Tokenizer.from_file(spec["tokenizer"])
        frames = spec["frames"]
        n_max = max(spec["clients"])
        texts = [TEXTS[i % len(TEXTS)] + f" Number {i}." for i in range(n_max)]
        configs = [GenerationConfig(seed=i, max_new_tokens=frames, im_end_id=tokenizer.im_end_id)
                   for i in range(n_max)]
        # in process: its own model and codec (the engine's server owns the other model)
        model = s2core.load(spec["path"], backend=name)
        codec = s2core.load_codec(demo_codec_path())
        hp = model.hparams
        prompts = [build_prompt(tokenizer, t, hparams=hp) for t in texts]
        out["max_batch_sequences"] = model.capabilities.max_batch_sequences

        def in_process(n: int, audio: bool) -> dict[str, Any]:
            outs = [AudioOut(codec, stream=True) for _ in range(n)] if audio else None
            on_frame = (lambda i, j, f: outs[i].frame(f)) if audio else None
            t0 = time.perf_counter()
            # the same slot capacity as the HTTP engine's (K/V is allocated whole per slot)
            codes = generate_many(model, prompts[:n], configs[:n], max_sequences=n,
                                  on_frame=on_frame, max_seq_len=spec["slot_positions"])
            wall = time.perf_counter() - t0
            made = sum(c.shape[1] for c in codes)
            return {"frames": made, "wall_s": wall, "frames_per_s": made / wall}

        engine = Engine(s2core.load(spec["path"], backend=name), tokenizer,
                        s2core.load_codec(demo_codec_path()), spec["voices_dir"],
                        max_sequences=min(n_max, model.capabilities.max_batch_sequences),
                        max_queue=n_max, slot_positions=spec["slot_positions"])
        samples_per_frame = codec.samples_per_frame

        def over_http(base: str, n: int) -> dict[str, Any]:
            firsts: list[float] = [0.0] * n
            sizes = [0] * n
            statuses = [0] * n
            barrier = threading.Barrier(n + 1)

            def client(i: int) -> None:
                with httpx.Client(timeout=600) as http:
                    barrier.wait()
                    t = time.perf_counter()
                    with http.stream("POST", f"{base}/v1/audio/speech", json={
                            "model": "s2-pro", "input": texts[i], "voice": "default",
                            "response_format": "pcm", "stream_format": "audio", "seed": i,
                            "max_new_tokens": frames}) as r:
                        statuses[i] = r.status_code
                        for chunk in r.iter_raw():
                            if chunk and not sizes[i]:
                                firsts[i] = time.perf_counter() - t
                            sizes[i] += len(chunk)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
            for th in threads:
                th.start()
            barrier.wait()
            t0 = time.perf_counter()
            for th in threads:
                th.join()
            wall = time.perf_counter() - t0
            if any(s != 200 for s in statuses):
                raise RuntimeError(f"HTTP statuses {statuses}")
            made = sum(s // 2 // samples_per_frame for s in sizes)
            return {"frames": made, "wall_s": wall, "frames_per_s": made / wall,
                    "first_audio_s": firsts}

        with local_server(create_app(engine)) as base:
            t = time.perf_counter()
            over_http(base, 1)  # warm-up: kernels, the codec, the server
            in_process(1, audio=True)
            print(f"      warm-up {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
            runs: dict[int, list[dict[str, Any]]] = {n: [] for n in spec["clients"]}
            started = time.perf_counter()
            for k in range(spec["rounds"]):
                if k and time.perf_counter() - started > spec["budget_s"]:
                    out["stopped"] = f"budget of {spec['budget_s']:.0f} s spent after {k} rounds"
                    break
                sizes = list(spec["clients"])
                for n in sizes[k % len(sizes):] + sizes[:k % len(sizes)]:
                    row = {}
                    for path, run in (("codes", lambda: in_process(n, audio=False)),
                                      ("audio", lambda: in_process(n, audio=True)),
                                      ("http", lambda: over_http(base, n))):
                        row[path] = run()
                        print(f"      round {k + 1}, N={n}, {path}: "
                              f"{row[path]['frames_per_s']:.2f} frames/s", file=sys.stderr,
                              flush=True)
                    runs[n].append(row)
        for n, rows in runs.items():
            if not rows:
                continue
            firsts = [x for r in rows for x in r["http"]["first_audio_s"]]
            row = {"clients": n, "rounds": len(rows),
                   "frames": rows[0]["http"]["frames"],
                   "same_frames": all(r["http"]["frames"] == r["audio"]["frames"]
                                      == r["codes"]["frames"] for r in rows),
                   "first_audio_p50_s": float(np.percentile(firsts, 50)),
                   "first_audio_p95_s": float(np.percentile(firsts, 95))}
            for path in ("codes", "audio", "http"):
                row[f"{path}_frames_per_s"] = float(np.median(
                    [r[path]["frames_per_s"] for r in rows]))
                row[f"{path}_frames_per_s_rounds"] = [r[path]["frames_per_s"] for r in rows]
            # per round: the same round's paths, so a load drift between rounds cancels
            row["http_vs_audio"] = float(np.median([r["http"]["frames_per_s"]
                                                    / r["audio"]["frames_per_s"] for r in rows]))
            row["http_vs_codes"] = float(np.median([r["http"]["frames_per_s"]
                                                    / r["codes"]["frames_per_s"] for r in rows]))
            out["clients"].append(row)
        model.close()
        codec.close()
    except BaseException as exc:  # report what was measured, and why the rest was not
        out["status"] = "error"
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    return out


# ---------------------------------------------------------------------- the parent
def run_http_benchmark(cfg, say: Callable[[str], None], frames: int = 6,
                       rounds: int = 1) -> dict[str, Any]:
    from s2core.benchmarking import machine
    from s2core.benchmarking.models import prepare_model
    from s2core.benchmarking.runner import child_env, select_backends
    from s2core.embedded.cache import demo_codec_path
    from s2core.embedded.tokenizer import cached_tokenizer

    info = machine.describe()
    hp = cfg.hparams()
    clients = (1, 4) if cfg.quick else CLIENTS
    rounds = 1 if cfg.quick else rounds
    report: dict[str, Any] = {
        "schema": SCHEMA, "case": "http",
        "created": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "config": cfg.as_dict(), "machine": info, "model_label": cfg.model_label,
        "machine_tag": machine.machine_tag(info), "results": [], "frames": frames,
        "rounds": rounds, "clients": list(clients), "codec": "embedded demo codec",
        "load_average_start": list(load_average())}
    for line in machine.summary_lines(info):
        say(line)
    names, skipped = select_backends(cfg.backends)
    report["skipped_backends"] = skipped
    demo_codec_path()
    if cfg.quick:  # the test-sized shape has no room for a tokenizer: the embedded model
        from s2core.embedded.default import default_model_files
        report["model_label"] = "the embedded default model (--quick)"
        model, tokenizer = default_model_files()
        files = {"f16": model}
    else:
        tokenizer = cached_tokenizer(hp, directory=cfg.model_dir)
        files = {t: prepare_model(hp, t, cfg.seed, 1, cfg.model_dir).path for t in cfg.types}
    with tempfile.TemporaryDirectory(prefix="s2core-http-") as tmp:
        for wtype, path in files.items():
            for name in names:
                say(f"[{wtype}] {name}: {', '.join(map(str, clients))} streaming clients over "
                    "HTTP and in process, in a fresh process ...")
                spec = {"backend": name, "weight_type": wtype, "path": str(path),
                        "tokenizer": str(tokenizer), "voices_dir": str(Path(tmp) / "voices"),
                        "clients": list(clients), "frames": frames, "rounds": rounds,
                        "slot_positions": 256, "budget_s": cfg.phase_budget_s * 4}
                result = run_child("http", spec, tmp, child_env(cfg.threads),
                                   cfg.child_timeout_s)
                if result["status"] == "ok":
                    for row in result["clients"]:
                        say(f"    N={row['clients']}: first audio p50 "
                            f"{row['first_audio_p50_s']:.2f} s, p95 "
                            f"{row['first_audio_p95_s']:.2f} s; frames/s HTTP "
                            f"{row['http_frames_per_s']:.2f}, in process with audio "
                            f"{row['audio_frames_per_s']:.2f}, codes only "
                            f"{row['codes_frames_per_s']:.2f}")
                else:
                    say(f"    FAILED: {result['error']}")
                report["results"].append(result)
    report["load_average_end"] = list(load_average())
    return report


# ---------------------------------------------------------------------- output
def table_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"HTTP case ({report['model_label']}; codec: {report['codec']}): N streaming "
             f"clients at once, each a different text and seed, at most {report['frames']} "
             f"frames each; {report['rounds']} interleaved round(s), medians over rounds.",
             "", "| type | backend | N | frames | first audio p50 s | p95 s | HTTP frames/s | "
             "in process + audio | generate_many (codes) | HTTP / in process + audio | "
             "HTTP / generate_many |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        if r["status"] != "ok":
            lines.append(f"| {r['weight_type']} | {r['backend']} | failed: {r['error']} "
                         "| | | | | | | | |")
            continue
        for row in r["clients"]:
            lines.append(
                f"| {r['weight_type']} | {r['backend']} | {row['clients']} | {row['frames']} "
                f"| {row['first_audio_p50_s']:.2f} | {row['first_audio_p95_s']:.2f} | "
                f"{row['http_frames_per_s']:.2f} | {row['audio_frames_per_s']:.2f} | "
                f"{row['codes_frames_per_s']:.2f} | {row['http_vs_audio']:.2f} | "
                f"{row['http_vs_codes']:.2f} |")
        if r.get("stopped"):
            lines.append(f"| {r['weight_type']} | {r['backend']} | {r['stopped']} |||||||||")
    lines += ["", "first audio = from a client's request to its first audio byte; frames/s = "
              "all N requests' frames over the wall time of the N; the ratios are medians of "
              "each round's own ratio.",
              f"Load average at start {report['load_average_start']}, end "
              f"{report['load_average_end']}."]
    return lines


def write_chart(report: dict[str, Any], path: Path) -> None:
    ok = [r for r in report["results"] if r["status"] == "ok" and r["clients"]]
    if not ok:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from s2core.benchmarking.chart import _color, finish_sweep_figure

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for j, r in enumerate(ok):
        xs = [row["clients"] for row in r["clients"]]
        color = _color(r["backend"], j)
        label = f"{r['backend']} {r['weight_type']}"
        for key, style, what in (("http", "-", "HTTP"), ("audio", "--", "in process + audio"),
                                 ("codes", ":", "generate_many")):
            ax1.plot(xs, [row[f"{key}_frames_per_s"] for row in r["clients"]], style,
                     marker="o", color=color, label=f"{label}: {what}")
        ax2.plot(xs, [row["first_audio_p50_s"] for row in r["clients"]], "-", marker="o",
                 color=color, label=f"{label}: p50")
        ax2.plot(xs, [row["first_audio_p95_s"] for row in r["clients"]], "--", marker="o",
                 color=color, label=f"{label}: p95")
    finish_sweep_figure(fig, ((ax1, "Aggregate frames per second", "frames/s"),
                              (ax2, "Time to first audio over HTTP", "s")),
                        report["clients"], "concurrent streaming clients N",
                        f"s2core bench --case http: {report['model_label']}; "
                        f"{report['machine_tag']}", path, legend_size=7)


def write_outputs(report: dict[str, Any], out_dir: Path) -> int:
    return write_case_outputs("http", report, out_dir, table_lines(report), write_chart)


def main(argv: list[str] | None = None) -> int:
    return child_main(measure, argv)


if __name__ == "__main__":
    sys.exit(main())
