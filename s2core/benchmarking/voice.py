"""The voice case: time to first frame with a cold prompt vs with a restored voice prefix.

    s2core bench --case voice [--backends numpy,torch] [--types f16] [--layers 4]

The prompt is SPEC 7's with a reference voice: the system turn, a transcript, 215 reference
frames (10 s of audio), then a 40-token text. Its voice prefix (everything up to and including
the reference codes, ~250 positions) is prefilled once per backend and saved to a file; then,
in each backend's own process, alternately:

* cold: `stream(model, prompt)` up to its first frame (the whole prompt prefilled);
* warm: `KVPrefix.load(file)` (memory-mapped) and `stream(model, prompt, prefix=...)` up to its
  first frame (the prefix's K/V written into the cache, only the text part prefilled).

Both are the real generation path (s2core.generation.stream); the stream's own timings split
each into restore and prefill, and the time to first frame includes the first sampled token
and the Fast-AR's nine codes. The figure of merit is (restore + prefill of the rest) / (cold
prefill), with the time to first frame beside it.
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

#: the voice case's shape (the issue's: a 10-second reference and a sentence)
REFERENCE_FRAMES = 215
TEXT_TOKENS = 40
TRANSCRIPT = ("When we listen to a friend on the telephone we know who is speaking after a "
              "single sentence, long before we have understood what it means.")
SCHEMA = "s2core-bench-voice/1"


def text_of_tokens(tokenizer, n: int) -> str:
    """A text from the embedded corpus that encodes to exactly n tokens (or the nearest)."""
    from s2core.embedded.corpus import CORPUS
    words = CORPUS.split()
    best = None
    for start in range(len(words)):
        for stop in range(start + 1, len(words) + 1):
            text = " ".join(words[start:stop])
            k = len(tokenizer.encode(text))
            if best is None or abs(k - n) < abs(best[0] - n):
                best = (k, text)
            if k >= n:
                break
        if best[0] == n:
            return best[1]
    return best[1]


def voice_hparams(cfg):
    """S2 Pro's shape; with --quick the demo model's (its vocabulary holds a tokenizer, which
    the test-sized one's 200 ids cannot)."""
    if cfg.quick:
        import dataclasses
        from s2core.embedded.writer import demo_hparams
        return dataclasses.replace(demo_hparams(), n_layer=cfg.layers)
    return cfg.hparams()


def voice_prompt(hp, seed: int) -> dict[str, Any]:
    """The prompt's two parts and what they hold."""
    from s2core.embedded.tokenizer import build_tokenizer_json
    from s2core.text.prompt import split_prompt
    from s2core.text.tokenizer import Tokenizer
    tok = Tokenizer.from_str(build_tokenizer_json(hp))
    codes = np.random.default_rng([seed, 5]).integers(0, hp.codebook_size,
                                                      (hp.num_codebooks, REFERENCE_FRAMES))
    text = text_of_tokens(tok, TEXT_TOKENS)
    prefix, rest = split_prompt(tok, text, TRANSCRIPT, codes, hparams=hp)
    return {"prefix": prefix, "rest": rest, "im_end_id": tok.im_end_id, "text": text,
            "text_tokens": len(tok.encode(text)), "transcript_tokens": len(tok.encode(TRANSCRIPT)),
            "reference_frames": REFERENCE_FRAMES}


# ---------------------------------------------------------------------- the child
def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import s2core
    from s2core.generation.loop import GenerationConfig, GenerationStats, stream
    from s2core.runtime.prefix import KVPrefix
    from s2core.contract.registry import get_registry

    name = spec["backend"]
    out: dict[str, Any] = {"backend": name, "weight_type": spec["weight_type"], "status": "ok"}
    try:
        get_registry().backend_class(name)
        t = time.perf_counter()
        model = s2core.load(spec["path"], backend=name)
        out["load_s"] = time.perf_counter() - t
        out["capabilities"] = model.capabilities.describe()
        prefix_rows = np.load(spec["prefix_rows"])
        prompt = np.vstack([prefix_rows, np.load(spec["rest_rows"])])
        config = GenerationConfig(max_new_tokens=8, seed=0, im_end_id=spec["im_end_id"])

        t = time.perf_counter()
        model.init_kv_cache(len(prefix_rows))
        model.prefill(prefix_rows)
        prefix = model.save_prefix()
        model.clear_kv_cache()
        path = prefix.save(Path(spec["tmp"]) / f"{name}.kvprefix.safetensors")
        out["prefix_make_s"] = time.perf_counter() - t
        out["prefix_file_bytes"] = path.stat().st_size

        def first_frame(use_prefix: bool) -> dict[str, float]:
            t0 = time.perf_counter()
            restored = KVPrefix.load(path) if use_prefix else None
            load_s = time.perf_counter() - t0
            stats = GenerationStats()
            it = stream(model, prompt, config, restored, stats)
            next(it)
            ttff = time.perf_counter() - t0
            it.close()
            return {"prefix_load_ms": load_s * 1e3, "restore_ms": stats.restore_s * 1e3,
                    "prefill_ms": stats.prefill_s * 1e3,
                    "prompt_ms": (load_s + stats.restore_s + stats.prefill_s) * 1e3,
                    "first_frame_ms": ttff * 1e3,
                    "prefilled_positions": stats.prefilled_positions,
                    "restored_positions": stats.restored_positions,
                    "recomputed": stats.prefix_recomputed}

        first_frame(False)  # warm-up: first touch of weights and buffers
        first_frame(True)
        runs: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
        started = time.perf_counter()
        for i in range(spec["reps"]):
            if i >= spec["min_reps"] and time.perf_counter() - started > spec["budget_s"]:
                break
            for case in ("cold", "warm"):  # alternated: drift hits both alike
                runs[case].append(first_frame(case == "warm"))
        for case, rows in runs.items():
            out[case] = {key: float(np.median([r[key] for r in rows])) for key in rows[0]}
            out[case]["n"] = len(rows)
        out["prompt_positions"] = len(prompt)
        out["prefix_positions"] = len(prefix_rows)
        model.close()
    except BaseException as exc:  # report what was measured, and why the rest was not
        out["status"] = "error"
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    return out


# ---------------------------------------------------------------------- the parent
def run_voice_benchmark(cfg, say: Callable[[str], None]) -> dict[str, Any]:
    from s2core.benchmarking import machine
    from s2core.benchmarking.models import prepare_model
    from s2core.benchmarking.runner import child_env, select_backends

    info = machine.describe()
    hp = voice_hparams(cfg)
    report: dict[str, Any] = {
        "schema": SCHEMA, "case": "voice",
        "created": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "config": cfg.as_dict(), "machine": info,
        "model_label": (f"demo-sized, {cfg.layers} Slow-AR layer(s)" if cfg.quick
                        else cfg.model_label),
        "machine_tag": machine.machine_tag(info), "results": [],
        "load_average_start": list(load_average())}
    for line in machine.summary_lines(info):
        say(line)
    parts = voice_prompt(hp, cfg.seed)
    report["prompt"] = {k: parts[k] for k in ("text", "text_tokens", "transcript_tokens",
                                             "reference_frames")}
    report["prompt"].update(prefix_positions=len(parts["prefix"]),
                            rest_positions=len(parts["rest"]))
    say(f"prompt: {len(parts['prefix'])} voice-prefix positions ({REFERENCE_FRAMES} reference "
        f"frames) + {len(parts['rest'])} text positions ({parts['text_tokens']} text tokens)")
    names, skipped = select_backends(cfg.backends)
    report["skipped_backends"] = skipped
    types = cfg.types
    with tempfile.TemporaryDirectory(prefix="s2core-voice-") as tmp:
        np.save(Path(tmp) / "prefix.npy", parts["prefix"])
        np.save(Path(tmp) / "rest.npy", parts["rest"])
        for wtype in types:
            acct = prepare_model(hp, wtype, cfg.seed, 1, cfg.model_dir)
            for name in names:
                say(f"[{wtype}] {name}: cold vs restored prefix, in a fresh process ...")
                spec = {"backend": name, "weight_type": wtype, "path": acct.path, "tmp": tmp,
                        "prefix_rows": str(Path(tmp) / "prefix.npy"),
                        "rest_rows": str(Path(tmp) / "rest.npy"), "im_end_id": parts["im_end_id"],
                        "reps": 1 if cfg.quick else 5, "min_reps": 1 if cfg.quick else 3,
                        "budget_s": cfg.phase_budget_s}
                result = run_child("voice", spec, tmp, child_env(cfg.threads), cfg.child_timeout_s)
                if result["status"] == "ok":
                    c, w = result["cold"], result["warm"]
                    result["prompt_ratio"] = w["prompt_ms"] / c["prompt_ms"]
                    result["first_frame_ratio"] = w["first_frame_ms"] / c["first_frame_ms"]
                    say(f"    prompt {c['prompt_ms']:.0f} ms cold, {w['prompt_ms']:.0f} ms "
                        f"with the prefix ({result['prompt_ratio']:.2f}x); first frame "
                        f"{c['first_frame_ms']:.0f} -> {w['first_frame_ms']:.0f} ms")
                else:
                    say(f"    FAILED: {result['error']}")
                report["results"].append(result)
    report["load_average_end"] = list(load_average())
    return report


# ---------------------------------------------------------------------- output
def table_lines(report: dict[str, Any]) -> list[str]:
    p = report["prompt"]
    share = p["rest_positions"] / (p["prefix_positions"] + p["rest_positions"])
    lines = [f"Voice case ({report['model_label']}): prompt = {p['prefix_positions']} voice-prefix "
             f"positions ({p['reference_frames']} reference frames, a {p['transcript_tokens']}-"
             f"token transcript) + {p['rest_positions']} text positions ({p['text_tokens']}-token "
             f"text): the text part is {share:.3f} of the prompt's positions, the least the "
             "prompt ratio could be. Medians, ms.", "",
             "| type | backend | cold prefill | restore | rest prefill | prompt ratio | "
             "first frame cold | first frame warm | ratio | n |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        if r["status"] != "ok":
            lines.append(f"| {r['weight_type']} | {r['backend']} | failed: {r['error']} "
                         "| | | | | | | |")
            continue
        c, w = r["cold"], r["warm"]
        restore = w["prefix_load_ms"] + w["restore_ms"]
        lines.append(f"| {r['weight_type']} | {r['backend']} | {c['prefill_ms']:.0f} | "
                     f"{restore:.1f} | {w['prefill_ms']:.0f} | {r['prompt_ratio']:.3f} | "
                     f"{c['first_frame_ms']:.0f} | {w['first_frame_ms']:.0f} | "
                     f"{r['first_frame_ratio']:.3f} | {c['n']} |")
    lines += ["", "restore = KVPrefix.load (memory-mapped) + restore_prefix; prompt ratio = "
              "(restore + rest prefill) / cold prefill; first frame = from the call to the first "
              "frame's codes (prompt, first sample, nine Fast-AR codes).",
              f"Load average at start {report['load_average_start']}, end "
              f"{report['load_average_end']}."]
    return lines


def write_outputs(report: dict[str, Any], out_dir: Path) -> int:
    return write_case_outputs("voice", report, out_dir, table_lines(report))


def main(argv: list[str] | None = None) -> int:
    return child_main(measure, argv)


if __name__ == "__main__":
    sys.exit(main())
