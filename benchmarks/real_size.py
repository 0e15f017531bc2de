#!/usr/bin/env python
"""The real-size case: a 36-layer S2 Pro-shaped file loaded as a user loads it, measured once.

    python benchmarks/real_size.py [--type q4_k_m] [--layers 36] [--frames 15] [--backend numpy]

Writes the file into the model cache (quantized tensors as random valid blocks: the K-quant
quantizer takes minutes a layer, and times do not depend on the values), reads it once so the
load below finds it in the page cache, then in this one process:

* memory read bandwidth (bandwidth.py), before and after the model is measured;
* s2core.load(path) with the auto-selected backend: load time, resident memory after load
  (RSS growth, anonymous + file pages) against the file size;
* a frame as the generation loop runs it: one decode step (from a 256-position context) plus
  num_codebooks - 1 fast_decode calls, median of `--frames`, against its floor: the bytes a
  step and those calls read as stored (workload.py), over the read bandwidth (and over the
  sum bandwidth, issue 10's figure);
* the sum bandwidth sampled again right after each frame, and each frame against that floor:
  the machine's speed moves between minutes here, and a floor measured at another minute
  can be from a faster or slower moment.

Results go to benchmarks/results/real-size-<date>-<time>-<machine tag>-<type>-<backend>.json
and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
import psutil  # noqa: E402

import s2core  # noqa: E402
from s2core.benchmarking import machine, resident  # noqa: E402
from s2core.benchmarking.bandwidth import SumProbe, measure_bandwidth  # noqa: E402
from s2core.benchmarking.timing import MIN_WALL_FOR_SHARE_S, machine_busy_s  # noqa: E402
from s2core.benchmarking.models import (RANDOM_BLOCK_TYPES, WriteProgress,  # noqa: E402
                                        warm_page_cache)
from s2core.benchmarking.workload import account, floor_ms  # noqa: E402
from s2core.embedded.cache import cached_model  # noqa: E402
from s2core.embedded.writer import s2pro_hparams  # noqa: E402
from s2core.modelfile.file import ModelFile  # noqa: E402
from s2core.kit.prompts import mixed_prompt, semantic_frame  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--type", default="q4_k_m")
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--frames", type=int, default=15)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--backend", default=None,
                   help="the backend to measure (default: the one load() picks for the file)")
    args = p.parse_args(argv)

    hp = s2pro_hparams(n_layer=args.layers)
    t0 = time.perf_counter()
    path = cached_model(hp, args.type, directory=args.model_dir,
                        progress=WriteProgress(f"{args.type}, {args.layers} layers"),
                        random_blocks=args.type in RANDOM_BLOCK_TYPES)
    print(f"file {path} ({path.stat().st_size / 1e9:.2f} GB), ready in "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    warm_page_cache(path)
    mf = ModelFile(path)
    acc = account(mf, args.type, 1)
    mf.close()

    bw_before = measure_bandwidth(512, 5)
    print(f"read bandwidth {bw_before.read_gbps:.1f} GB/s", file=sys.stderr)
    picked = s2core.default_backend(str(path))
    backend = args.backend or picked
    s2core.get_registry().backend_class(backend)  # the backend's import is not the load
    probe = SumProbe(256)  # allocated before the baseline: not counted as the model's
    base = resident.snapshot()
    t0 = time.perf_counter()
    model = s2core.load(str(path), backend=backend)
    load_s = time.perf_counter() - t0
    after = resident.snapshot()
    grown = {k: after[k] - base[k] for k in ("rss", "anon", "file") if k in after}
    print(f"{backend}: load {load_s:.1f} s, resident +{grown['rss'] / 1e9:.2f} GB",
          file=sys.stderr)

    model.init_kv_cache(args.context + 64)
    rng = np.random.default_rng(1)
    model.prefill_fast(mixed_prompt(hp, args.context, rng)).logits  # noqa: B018
    calls = hp.num_codebooks - 1
    frames, steps, beside = [], [], []
    others = Others()
    for i in range(args.frames + 1):  # the first frame warms up
        if i == 1:
            others.start()
        frame = semantic_frame(hp, rng)
        t0 = time.perf_counter()
        result = model.step(frame)
        result.logits  # noqa: B018
        t1 = time.perf_counter()
        hidden = result.hidden_native
        for k in range(1, calls + 1):
            model.fast_decode(hidden, frame[1:1 + k])
        t2 = time.perf_counter()
        if i:
            steps.append((t1 - t0) * 1e3)
            frames.append((t2 - t0) * 1e3)
            beside.append(probe.sample())
    others_share = others.stop()
    probe.close()
    end = resident.snapshot()
    model.close()
    bw_after = measure_bandwidth(512, 5)

    read_gbps = max(bw_before.read_gbps, bw_after.read_gbps)
    frame_bytes = acc.step_read_bytes + acc.fast_frame_read_bytes
    report = {
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine.describe(), "type": args.type, "layers": args.layers,
        "random_blocks": args.type in RANDOM_BLOCK_TYPES, "path": str(path),
        "file_bytes": acc.file_bytes, "backend": backend, "load_picks": picked,
        "native_weight_types": sorted(model.capabilities.native_weight_types),
        "load_s": load_s, "resident_growth": grown,
        "resident_over_file": grown["rss"] / acc.file_bytes,
        "rss_end_over_file": (end["rss"] - base["rss"]) / acc.file_bytes,
        "bandwidth_before": bw_before.as_dict(), "bandwidth_after": bw_after.as_dict(),
        "read_gbps_used": read_gbps, "step_read_bytes": acc.step_read_bytes,
        "fast_frame_read_bytes": acc.fast_frame_read_bytes, "fast_calls": calls,
        "context": args.context, "step_ms": steps, "frame_ms": frames,
        "step_median_ms": statistics.median(steps), "frame_median_ms": statistics.median(frames),
        "others_cpu_share": others_share,
        "step_floor_ms": floor_ms(acc.step_read_bytes, read_gbps),
        "frame_floor_ms": floor_ms(frame_bytes, read_gbps),
        # issue 10's own figure (bandwidth.py: a float32 sum, one thread per core)
        "sum_gbps_used": max(bw_before.sum_gbps, bw_after.sum_gbps),
    }
    report["frame_sum_floor_ms"] = floor_ms(frame_bytes, report["sum_gbps_used"])
    # each frame against the sum bandwidth sampled right after it (one sum of 256 MiB)
    report["sum_gbps_beside_frames"] = beside
    report["frame_over_sum_floor_beside"] = statistics.median(
        t / floor_ms(frame_bytes, g) for t, g in zip(frames, beside))
    report["frame_over_sum_floor"] = report["frame_median_ms"] / report["frame_sum_floor_ms"]
    report["step_over_floor"] = report["step_median_ms"] / report["step_floor_ms"]
    report["frame_over_floor"] = report["frame_median_ms"] / report["frame_floor_ms"]
    text = markdown(report)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / (f"real-size-{dt.datetime.now():%Y%m%d-%H%M}-"
                       f"{machine.machine_tag(report['machine'])}-{args.type}-{backend}")
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    stem.with_suffix(".md").write_text(text)
    print(f"wrote {stem}.json, .md", file=sys.stderr)
    return 0


class Others:
    """The share of the machine's CPU time that others (processes, the hypervisor) took
    between start() and stop(), as the bench's phases report it (timing.py)."""

    def start(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        self.busy = machine_busy_s()

    def stop(self) -> float | None:
        wall = time.perf_counter() - self.wall
        if wall < MIN_WALL_FOR_SHARE_S:
            return None
        theirs = machine_busy_s() - self.busy - (time.process_time() - self.cpu)
        return min(1.0, max(0.0, theirs / (wall * (psutil.cpu_count() or 1))))


def _percent(share: float | None) -> str:
    return "an unknown share" if share is None else f"{share * 100:.0f} %"


def markdown(r: dict) -> str:
    g = r["resident_growth"]
    return "\n".join([
        f"# Real-size {r['type']}: {r['layers']} Slow-AR layers, backend {r['backend']}"
        + (" (load()'s pick)" if r["backend"] == r.get("load_picks", r["backend"])
           else f" (load() picks {r['load_picks']})"),
        "",
        f"{r['created']}; file {r['file_bytes'] / 1e9:.2f} GB"
        + (" (random valid blocks)" if r["random_blocks"] else "")
        + f", read from the page cache; backend `{r['backend']}` (keeps "
          f"{', '.join(r['native_weight_types'])}).",
        f"Read bandwidth {r['bandwidth_before']['read_gbps']:.1f} GB/s before, "
        f"{r['bandwidth_after']['read_gbps']:.1f} after (floors use {r['read_gbps_used']:.1f}); "
        f"issue 10's sum bandwidth (float32, one thread per core) {r['sum_gbps_used']:.1f}.",
        "",
        "| what | measured | target |",
        "|---|---:|---:|",
        f"| load | {r['load_s']:.1f} s | < 10 s |",
        f"| resident after load / file | {r['resident_over_file']:.3f} "
        f"({g['rss'] / 1e9:.2f} GB: anon {g.get('anon', 0) / 1e9:.2f}, file pages "
        f"{g.get('file', 0) / 1e9:.2f}) | <= 1.15 |",
        f"| decode step (context {r['context']}) | {r['step_median_ms']:.0f} ms = "
        f"{r['step_over_floor']:.2f}x its floor {r['step_floor_ms']:.0f} ms | |",
        f"| frame: step + {r['fast_calls']} fast_decode | {r['frame_median_ms']:.0f} ms = "
        f"{r['frame_over_floor']:.2f}x its floor {r['frame_floor_ms']:.0f} ms | |",
        f"| the same frame against issue 10's floor (sum bandwidth) | "
        f"{r['frame_over_sum_floor']:.2f}x its floor {r['frame_sum_floor_ms']:.0f} ms | <= 1.3x |",
        f"| each frame against the sum bandwidth sampled right after it (median) | "
        f"{r['frame_over_sum_floor_beside']:.2f}x (samples "
        f"{min(r['sum_gbps_beside_frames']):.1f}-{max(r['sum_gbps_beside_frames']):.1f} GB/s) "
        "| <= 1.3x |",
        "",
        f"Frames (ms): {', '.join(f'{t:.0f}' for t in r['frame_ms'])}; steps (ms): "
        f"{', '.join(f'{t:.0f}' for t in r['step_ms'])}. While they ran, other processes and "
        f"the hypervisor (steal) took {_percent(r.get('others_cpu_share'))} of the machine's "
        "CPU time (above ~20 % the times are inflated).",
        "",
    ])


if __name__ == "__main__":
    sys.exit(main())
