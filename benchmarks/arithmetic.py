"""arithmetic="ggml" against "f32" on the NumPy backend: decode step and Fast-AR frame, in one
run, alternated, on the bench's S2 Pro-shaped files (4 layers by default), each against its
read floor (the bytes it must stream at the read bandwidth: the mean of samples before every
round and after the last, and per round the two around it, "..._over_floor_by_round"; and
one sample right after every frame, each step against its own, "..._over_floor_beside"), and a
100-position prefill (compute-bound: the two arithmetics against each other).

Steps and frames are timed twice, alternated: over the whole vocabulary ("step", "frame"),
and as generation runs them, computing only the rows it samples from ("sampled_step",
"sampled_frame": contract.md, "Logit rows"), each against the bytes it reads.

    python benchmarks/arithmetic.py [--types q4_k_m,q6_k,q8_0,f16] [--layers 4] [--steps 15]
    python benchmarks/arithmetic.py --avx2 ...   # the AVX2 code, on an AVX-512 machine
    python benchmarks/arithmetic.py --layers 36 --types q4_k_m --rounds 1   # real size

--avx2 compiles numba's kernels for a Haswell (NUMBA_CPU_NAME and NUMBA_CPU_FEATURES: the
name alone keeps the host's features), so AVX-512 machines measure what AVX2-only CPUs run.

Prints a table and writes benchmarks/results/arithmetic-<date>-<time>[-avx2].json (everything)
and .md (the table), with the CPU model and flags, numba's target and the integer kernels'
instruction set, and the share of the CPU other processes took during the run (the machine
may be shared: compare the ratios, treat absolute times with care).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import s2core  # noqa: E402
from s2core.benchmarking.bandwidth import GemvProbe, measure_bandwidth
from s2core.benchmarking.machine import HASWELL, cpu_flags, cpu_model
from s2core.benchmarking.models import prepare_model
from s2core.benchmarking.workload import floor_ms, sampled_rows
from s2core.embedded.writer import s2pro_hparams
from s2core.kit.prompts import mixed_prompt, semantic_frame
from s2core.generation.config import GenerationConfig, GenerationStats
from s2core.generation.frame import FrameRule


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine."""
    values = [float(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system


#: positions of the timed prefill (a prompt's text and voice codes, compute-bound)
PREFILL_ROWS = 100


def measure(model, steps: int, hp, probe: GemvProbe) -> dict[str, list[float]]:
    """Seconds of: decode steps over the whole vocabulary ("step") and over the rows
    generation samples from ("sampled_step", contract.md "Logit rows"), alternated; frames
    (each step, then the Fast-AR's calls); one PREFILL_ROWS-row prefill into an empty cache.
    After each frame, one sample of the read bandwidth (GB/s, "step_gbps" and
    "sampled_step_gbps"), the floor beside it."""
    rng = np.random.default_rng(0)
    prompt = mixed_prompt(hp, PREFILL_ROWS, rng)
    for _ in range(2):  # the first touches the weights (page faults of a mapped file)
        model.init_kv_cache(512)
        t0 = time.perf_counter()
        model.prefill_fast(prompt)
        prefill = time.perf_counter() - t0
    model.init_kv_cache(512)
    model.prefill_fast(mixed_prompt(hp, 256, rng))  # steps at 256-318 positions
    rows = FrameRule(hp, GenerationConfig(), GenerationStats()).logit_rows  # generation's
    assert len(rows) == sampled_rows(hp)
    times = {"step": [], "frame": [], "sampled_step": [], "sampled_frame": [],
             "step_gbps": [], "sampled_step_gbps": [], "prefill": [prefill]}
    for i in range(steps + 3):
        for kind, asked in (("", None), ("sampled_", rows)):
            frame = semantic_frame(hp, rng)
            t0 = time.perf_counter()
            r = model.step(frame, logit_rows=asked)
            t1 = time.perf_counter()
            for n in range(1, hp.num_codebooks):
                model.fast_decode(r.hidden, frame[1:1 + n])
            t2 = time.perf_counter()
            gbps = probe.sample()
            if i >= 3:
                times[kind + "step"].append(t1 - t0)
                times[kind + "frame"].append(t2 - t0)
                times[kind + "step_gbps"].append(gbps)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default="q4_k_m,q6_k,q8_0,f16")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--avx2", action="store_true",
                    help="compile numba's kernels for a Haswell (AVX2, no AVX-512)")
    args = ap.parse_args()
    if args.avx2:  # before numba is imported (the first load imports it)
        os.environ["NUMBA_CPU_NAME"] = "haswell"
        os.environ["NUMBA_CPU_FEATURES"] = HASWELL
    hp = s2pro_hparams(n_layer=args.layers)
    busy0, total0 = cpu_times()
    own0 = self_cpu()
    results = {}
    for wt in args.types.split(","):
        acct = prepare_model(hp, wt, seed=0, prefill_tokens=256)
        path = acct.path
        # the read bandwidth before every round and after the last: each round's times are
        # also set against the mean of the two samples around it, since this machine's
        # bandwidth moves (30-35 against 60 GB/s) between minutes
        bandwidths = [measure_bandwidth(256, 3).read_gbps]
        probe = GemvProbe(256)
        models = {a: s2core.load(path, backend="numpy", arithmetic=a) for a in ("f32", "ggml")}
        times = {a: {} for a in models}
        rounds = []  # per round: {arithmetic: {kind: median seconds}}
        for _ in range(args.rounds):  # alternated, so a busy spell hits both
            this_round = {}
            for a, m in models.items():
                measured = measure(m, args.steps, hp, probe)
                this_round[a] = {k: statistics.median(v) for k, v in measured.items()}
                for k, v in measured.items():
                    times[a].setdefault(k, []).extend(v)
            rounds.append(this_round)
            bandwidths.append(measure_bandwidth(256, 3).read_gbps)
        for m in models.values():
            m.close()
        probe.close()
        gbps = statistics.mean(bandwidths)
        beside = {a: {k: t.pop(k) for k in ("step_gbps", "sampled_step_gbps")}
                  for a, t in times.items()}
        row = {a: {k: statistics.median(v) * 1e3 for k, v in t.items()} for a, t in times.items()}
        row["read_gbps_samples"] = bandwidths
        read = {"step": acct.step_read_bytes, "sampled_step": acct.sampled_step_read_bytes}
        read["frame"] = read["step"] + acct.fast_frame_read_bytes
        read["sampled_frame"] = read["sampled_step"] + acct.fast_frame_read_bytes
        for kind, n_bytes in read.items():
            row[f"{kind}_read_bytes"] = n_bytes
            row[f"{kind}_floor_ms"] = floor_ms(n_bytes, gbps)
            for a in models:
                row[a][f"{kind}_over_floor"] = row[a][kind] / row[f"{kind}_floor_ms"]
                row[a][f"{kind}_over_floor_by_round"] = [
                    r[a][kind] * 1e3 / floor_ms(n_bytes, statistics.mean(bandwidths[i:i + 2]))
                    for i, r in enumerate(rounds)]
                # each step or frame against the sample taken right after it: the ratio
                # least moved by the machine's spells
                samples = beside[a][kind.replace("frame", "step") + "_gbps"]
                row[a][f"{kind}_over_floor_beside"] = statistics.median(
                    t * 1e3 / floor_ms(n_bytes, g) for t, g in zip(times[a][kind], samples))
                row[a][f"{kind}_beside_gbps_median"] = statistics.median(samples)
        row["ggml_over_f32_step"] = row["ggml"]["step"] / row["f32"]["step"]
        row["ggml_over_f32_frame"] = row["ggml"]["frame"] / row["f32"]["frame"]
        row["ggml_over_f32_prefill"] = row["ggml"]["prefill"] / row["f32"]["prefill"]
        row["ggml_over_f32_sampled_step"] = row["ggml"]["sampled_step"] / row["f32"]["sampled_step"]
        results[wt] = row
        print(wt, json.dumps(row), flush=True)
    busy1, total1 = cpu_times()
    wall_cpu = total1 - total0
    others = max(0.0, (busy1 - busy0) / 100.0 - (self_cpu() - own0)) / (wall_cpu / 100.0)
    from s2core_numpy import amx  # numba is imported by now
    from s2core_numpy.simd import isa
    kernels = (isa() or "none") + ("+amx" if amx.available() else "")
    report = {"layers": args.layers, "results_ms_median": results,
              "cpu_model": cpu_model(), "integer_kernels": kernels,
              "amx": amx.unavailable_reason() or "used from amx.MIN_ROWS rows",
              "cpu_flags": cpu_flags(), "numba_cpu_name": os.environ.get("NUMBA_CPU_NAME", ""),
              "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
              "others_cpu_share": round(others, 3)}
    lines = summary_lines(report)
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = time.strftime("%Y%m%d-%H%M")
    suffix = f"-{args.layers}l" + ("-avx2" if args.avx2 else "") + (
        "-no-amx" if os.environ.get("S2CORE_NO_AMX") else "")
    (out / f"arithmetic-{tag}{suffix}.json").write_text(json.dumps(report, indent=1))
    (out / f"arithmetic-{tag}{suffix}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / f'arithmetic-{tag}{suffix}'}.json, .md")


def summary_lines(report: dict) -> list[str]:
    """The run as a Markdown table: per file and arithmetic, the sampled step and frame (as
    generation runs them) against the floor beside each, and round by round against the
    samples between rounds; the whole-vocabulary step; the prefill."""
    lines = [f"# arithmetic.py: {report['layers']} layers, {report['cpu_model']}, integer "
             f"kernels {report['integer_kernels']}"
             + (f" (NUMBA_CPU_NAME={report['numba_cpu_name']})" if report["numba_cpu_name"]
                else ""), "",
             "| file | arithmetic | sampled step ms | x floor beside | x floor by round | "
             "sampled frame ms | x floor beside | step ms | prefill ms |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|"]
    for wt, row in report["results_ms_median"].items():
        for a in ("f32", "ggml"):
            r = row[a]
            rounds = ", ".join(f"{v:.2f}" for v in r["sampled_step_over_floor_by_round"])
            lines.append(
                f"| {wt} | {a} | {r['sampled_step']:.2f} | "
                f"{r['sampled_step_over_floor_beside']:.2f} | {rounds} | "
                f"{r['sampled_frame']:.1f} | {r['sampled_frame_over_floor_beside']:.2f} | "
                f"{r['step']:.2f} | {r['prefill']:.0f} |")
    lines += ["", "CPU flags: " + " ".join(report["cpu_flags"]),
              f"Others took {report['others_cpu_share']:.1%} of the CPU during the run."]
    return lines


if __name__ == "__main__":
    main()
