"""The parent process: machine, bandwidth, models, one child per (type, backend), derived figures.

The parent never loads a model; it only reads file headers for byte counts. Children are run
one at a time so they do not compete for cores or memory bandwidth.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import psutil

from s2core import list_backends
from s2core.modelfile.file import ModelFile
from s2core.contract.registry import BUILTIN_PLUGINS
from s2core.benchmarking import machine
from s2core.benchmarking.bandwidth import measure_bandwidth
from s2core.benchmarking.config import BenchConfig
from s2core.benchmarking.models import prepare_model
from s2core.benchmarking.workload import (floor_ms, kv_cache_bytes, layer_matrix_params, resident_step_bytes,
                       resident_weight_bytes)

SCHEMA = "s2core-bench/1"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
#: share of the CPU taken by other processes above which a phase's times are flagged
CONTENTION_WARNING = 0.2
#: backends known to be far from their real speed on some platforms, and what the output says
SLOW_PLATFORMS = {
    ("mlx", "linux"): "MLX on Linux runs on the CPU with its reference BLAS (10-80x slower matrix "
                      "products than NumPy's OpenBLAS): it is measured with the time cap, so with "
                      "fewer repetitions; its figures say nothing about MLX on Apple silicon",
}


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- backends
def select_backends(wanted: tuple[str, ...] | None) -> tuple[list[str], list[dict[str, Any]]]:
    """(names to measure, rows of those skipped with their reason)."""
    rows = list_backends()
    available = [r.name for r in rows if r.available]
    skipped = [{"backend": r.name, "reason": r.reason} for r in rows
               if not r.available and (wanted is None or r.name in wanted)]
    if wanted is None:
        return available, skipped
    known = {r.name for r in rows}
    skipped += [{"backend": n, "reason": "not registered"} for n in wanted if n not in known]
    return [n for n in wanted if n in available], skipped


def rotated(names: list[str], k: int) -> list[str]:
    """names starting at position k: each weight type runs the backends in another order, so
    no backend always runs right after the same one (a process's exit can change the memory
    conditions the next one finds)."""
    if not names:
        return []
    k %= len(names)
    return names[k:] + names[:k]


def slow_platform_note(backend: str) -> str | None:
    return SLOW_PLATFORMS.get((backend, sys.platform))


# ---------------------------------------------------------------------- children
def _package_roots() -> list[str]:
    """Directories that hold s2core and its built-in backends, for the child's PYTHONPATH (so a
    checkout that is not pip-installed benchmarks the same code)."""
    roots = {str(Path(__file__).resolve().parents[2])}
    for plugin in BUILTIN_PLUGINS:
        try:
            spec = importlib.util.find_spec(plugin.split(".")[0])
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            roots.add(str(Path(list(spec.submodule_search_locations)[0]).parent))
    return sorted(roots)


def child_env(threads: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(_package_roots() + [p for p in [env.get("PYTHONPATH")] if p])
    if threads:
        env.update({k: str(threads) for k in THREAD_VARS})
    return env


def run_child(cfg: BenchConfig, backend: str, weight_type: str, path: str) -> dict[str, Any]:
    """Measure one backend on one file in a fresh process; its result, or why there is none."""
    spec = {"backend": backend, "weight_type": weight_type, "path": path, "seed": cfg.seed,
            "context": cfg.context, "steps": cfg.steps, "warmup_steps": cfg.warmup_steps,
            "beside_steps": cfg.beside_steps,
            "prefill_tokens": cfg.prefill_tokens, "prefill_reps": cfg.prefill_reps,
            "fast_frames": cfg.fast_frames, "phase_budget_s": cfg.phase_budget_s,
            "min_reps": cfg.min_reps, "kv_capacity": cfg.kv_capacity, "threads": cfg.threads,
            "bandwidth_mb": cfg.bandwidth_mb}
    with tempfile.TemporaryDirectory(prefix="s2core-bench-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", "s2core.benchmarking.measure", str(spec_path), str(result_path)]
        try:
            proc = subprocess.run(cmd, env=child_env(cfg.threads), timeout=cfg.child_timeout_s,
                                  stdout=sys.stderr)
        except subprocess.TimeoutExpired:
            return _failure(backend, weight_type, f"timed out after {cfg.child_timeout_s:.0f} s")
        if result_path.exists():
            return json.loads(result_path.read_text())
        why = f"child exited with code {proc.returncode} and wrote no result"
        if proc.returncode == -signal.SIGKILL:
            why += " (SIGKILL: out of memory?)"
        return _failure(backend, weight_type, why)


def _failure(backend: str, weight_type: str, why: str) -> dict[str, Any]:
    _say(f"    [{backend} {weight_type}] FAILED: {why}")
    return {"backend": backend, "weight_type": weight_type, "status": "error", "error": why}


# ---------------------------------------------------------------------- derived figures
def derive(result: dict[str, Any], model: dict[str, Any], bw: dict[str, float]) -> dict[str, Any]:
    """Ratios and rates from one child's raw figures, its model's byte counts and the
    bandwidths (copy_gbps, read_gbps) the floors use."""
    d: dict[str, Any] = {}
    mem = result.get("memory", {})
    if "after_load" in mem:
        weights = mem["after_load"]["rss"] - mem["baseline"]["rss"]
        d["weights_rss_bytes"] = weights
        d["weights_rss_over_file"] = weights / model["file_bytes"]
        d["weights_rss_over_weight_bytes"] = weights / model["weight_bytes"]
        d["load_peak_bytes"] = mem["after_load"]["peak"]
        # Linux splits RSS: anonymous (copies the backend made) vs file pages (the mmap).
        for stage in ("after_load", "end"):
            for kind in ("anon", "file"):
                if stage in mem and kind in mem[stage]:
                    d[f"rss_{kind}_{stage}_bytes"] = mem[stage][kind] - mem["baseline"][kind]
    caps = result.get("capabilities")
    if caps:
        mf = ModelFile(model["path"])
        try:
            native, widened = caps["native_weight_types"], caps["widened_weight_dtype"]
            overhead = dict(caps.get("native_weight_overhead") or ())
            d["expected_resident_weight_bytes"] = resident_weight_bytes(mf, native, widened,
                                                                        overhead)
            d["resident_step_bytes"] = resident_step_bytes(mf, native, widened, overhead)
            d["kv_cache_bytes"] = kv_cache_bytes(mf.hparams, result["kv_capacity"],
                                                 caps["kv_cache_dtype"])
        finally:
            mf.close()
    if "end" in mem:
        d["kv_and_compute_rss_bytes"] = mem["end"]["rss"] - mem["after_load"]["rss"]
        d["peak_bytes"] = max(mem["after_load"]["peak"], mem["end"]["peak"])
    if "decode" in result:
        med = result["decode"]["median_ms"]
        d["step_floor_ms"] = floor_ms(model["step_read_bytes"], bw["copy_gbps"])
        d["step_ratio_to_floor"] = med / d["step_floor_ms"]
        d["step_read_floor_ms"] = floor_ms(model["step_read_bytes"], bw["read_gbps"])
        d["step_ratio_to_read_floor"] = med / d["step_read_floor_ms"]
        if "sum_gbps" in bw:  # issue 10's figure (bandwidth.py); older reports lack it
            d["step_sum_floor_ms"] = floor_ms(model["step_read_bytes"], bw["sum_gbps"])
            d["step_ratio_to_sum_floor"] = med / d["step_sum_floor_ms"]
        beside = result.get("decode_beside")
        if beside and beside["step_ms"]:  # each step against the sum sampled right after it
            d["step_ratio_to_sum_floor_beside"] = statistics.median(
                [t / floor_ms(model["step_read_bytes"], g)
                 for t, g in zip(beside["step_ms"], beside["sum_gbps"])])
        d["step_effective_gbps"] = model["step_read_bytes"] / (med / 1e3) / 1e9
        if "bandwidth_in_child" in result:
            child_read = result["bandwidth_in_child"]["read_gbps"]
            d["child_read_gbps"] = child_read
            d["step_ratio_to_child_read_floor"] = med / floor_ms(model["step_read_bytes"], child_read)
        if "resident_step_bytes" in d:
            d["resident_step_floor_ms"] = floor_ms(d["resident_step_bytes"], bw["copy_gbps"])
            d["step_ratio_to_resident_floor"] = med / d["resident_step_floor_ms"]
    if "prefill" in result:
        sec = result["prefill"]["median_ms"] / 1e3
        d["prefill_tokens_per_s"] = result["prefill"]["n_tokens"] / sec
        d["prefill_gflops"] = model["prefill_flops"] / sec / 1e9
    if "fast" in result:
        med = result["fast"]["median_ms"]
        d["fast_floor_ms"] = floor_ms(model["fast_frame_read_bytes"], bw["copy_gbps"])
        d["fast_ratio_to_floor"] = med / d["fast_floor_ms"]
        d["fast_ratio_to_read_floor"] = med / floor_ms(model["fast_frame_read_bytes"], bw["read_gbps"])
    return d


def rank_within_types(results: list[dict[str, Any]]) -> None:
    """Each result's step time as a multiple of the best backend's on the same weight type."""
    best: dict[str, float] = {}
    for r in results:
        if "decode" in r:
            t = r["weight_type"]
            best[t] = min(best.get(t, float("inf")), r["decode"]["median_ms"])
    for r in results:
        if "decode" in r:
            r["derived"]["step_ratio_to_best"] = r["decode"]["median_ms"] / best[r["weight_type"]]


# ---------------------------------------------------------------------- the run
def run_benchmark(cfg: BenchConfig, say: Callable[[str], None] = _say) -> dict[str, Any]:
    """Measure everything `cfg` asks for; returns the report (what the JSON file holds)."""
    info = machine.describe()
    report: dict[str, Any] = {
        "schema": SCHEMA, "created": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "config": cfg.as_dict(), "model_label": cfg.model_label, "machine": info,
        "machine_tag": machine.machine_tag(info), "notes": list(cfg.extra_notes),
        "layer_matrix_params": layer_matrix_params(cfg.hparams()),
    }
    for line in machine.summary_lines(info):
        say(line)
    busy = psutil.cpu_percent(interval=1.0)  # the parent is idle meanwhile: this is others
    report["others_cpu_percent_at_start"] = busy
    say(f"CPU used by other processes at start: {busy:.0f} %")
    if busy > CONTENTION_WARNING * 100:
        report["notes"].append(f"other processes used {busy:.0f} % of the CPU at the start; "
                               "see each phase's `others` share")

    samples: list[dict[str, Any]] = []

    def sample_bandwidth(when: str, reps: int) -> dict[str, Any]:
        b = {"when": when, **measure_bandwidth(cfg.bandwidth_mb, reps).as_dict()}
        samples.append(b)
        return b

    say(f"memory bandwidth ({cfg.bandwidth_mb} MiB arrays, best of {cfg.bandwidth_reps}) ...")
    first = sample_bandwidth("start", cfg.bandwidth_reps)
    say(f"  copy {first['copy_gbps']:.1f} GB/s (read + write); read {first['read_gbps']:.1f} GB/s "
        f"(float32 gemv {first['gemv_f32_gbps']:.1f}, float64 dot {first['dot_f64_gbps']:.1f}); "
        f"sum, one thread per core {first['sum_gbps']:.1f} GB/s")

    names, skipped = select_backends(cfg.backends)
    report["backends"] = [r.as_dict() for r in list_backends()]
    report["skipped_backends"] = skipped
    for s in skipped:
        say(f"backend {s['backend']} skipped: {s['reason']}")
    for n in names:
        if note := slow_platform_note(n):
            report["notes"].append(note)
            say(f"note: {note}")
    say(f"backends measured: {', '.join(names) or 'none'}; model: {cfg.model_label}")

    models: dict[str, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    for i, wtype in enumerate(cfg.types):
        say(f"[{wtype}] preparing the model ...")
        acct = prepare_model(cfg.hparams(), wtype, cfg.seed, cfg.prefill_tokens, cfg.model_dir)
        models[wtype] = acct.as_dict()
        say(f"[{wtype}] {acct.path}: file {acct.file_bytes / 1e9:.2f} GB, a step reads "
            f"{acct.step_read_bytes / 1e9:.3f} GB")
        for name in rotated(names, i):
            before = sample_bandwidth(f"before {name} {wtype}", max(2, cfg.bandwidth_reps // 2))
            say(f"  [{wtype}] {name}: measuring in a fresh process (bandwidth now: copy "
                f"{before['copy_gbps']:.1f}, read {before['read_gbps']:.1f} GB/s) ...")
            result = run_child(cfg, name, wtype, acct.path)
            result["bandwidth_before"] = before
            results.append(result)

    say("memory bandwidth again (after the backends) ...")
    sample_bandwidth("end", cfg.bandwidth_reps)
    # The floors use the best of all samples: what the machine can do when nothing disturbs it.
    bw = {"copy_gbps": max(b["copy_gbps"] for b in samples),
          "read_gbps": max(b["read_gbps"] for b in samples),
          "sum_gbps": max(b["sum_gbps"] for b in samples)}
    report["bandwidth"] = {**bw, "samples": samples,
                           "used_for_floors": "best copy, best read and best sum over all "
                                              "samples"}
    for wtype, m in models.items():
        m["step_floor_ms"] = floor_ms(m["step_read_bytes"], bw["copy_gbps"])
        m["step_read_floor_ms"] = floor_ms(m["step_read_bytes"], bw["read_gbps"])
        m["fast_floor_ms"] = floor_ms(m["fast_frame_read_bytes"], bw["copy_gbps"])
        m["fast_read_floor_ms"] = floor_ms(m["fast_frame_read_bytes"], bw["read_gbps"])
    for r in results:
        r["derived"] = derive(r, models[r["weight_type"]], bw) if r["status"] == "ok" else {}
        for phase in ("prefill", "decode", "fast"):
            share = r.get(phase, {}).get("others_cpu_share") or 0.0
            if share > CONTENTION_WARNING:
                report["notes"].append(
                    f"{r['backend']} {r['weight_type']} {phase}: other processes used "
                    f"{share * 100:.0f} % of the machine's CPU meanwhile; its times are inflated")
            if r.get(phase, {}).get("capped"):
                report["notes"].append(
                    f"{r['backend']} {r['weight_type']} {phase}: {r[phase]['n']} of "
                    f"{r[phase]['planned']} repetitions (time cap {cfg.phase_budget_s:.0f} s "
                    "per phase)")
    rank_within_types(results)
    results.sort(key=lambda r: (cfg.types.index(r["weight_type"]), names.index(r["backend"])))
    report["models"] = models
    report["results"] = results
    report["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return report
