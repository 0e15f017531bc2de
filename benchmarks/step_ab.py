#!/usr/bin/env python
"""A change's effect on the decode step and the prompt prefill, against another revision.

    python benchmarks/step_ab.py --against REV [--type f16] [--layers 4] [--backend numpy]
                                 [--runs 3] [--steps 22]

This script checks REV out beside the working tree (ab.py says why), then runs, alternately
and each in a fresh process, this tree and REV: load the S2 Pro-shaped model of `--type`
(written once into the model cache, as `s2core bench` does), prefill a 256-position prompt
(timed), then `--steps` decode steps (the median after three warm-up steps). Alternating
puts both under the same drift.
Results go to benchmarks/results/step-ab-<date>-<time>-<machine tag>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from ab import revision, tree_env, worktree, write_report  # noqa: E402
from s2core.benchmarking import machine  # noqa: E402
from s2core.benchmarking.config import BenchConfig  # noqa: E402
from s2core.benchmarking.models import prepare_model  # noqa: E402

#: what each child process runs: (model path, backend, steps) in argv, a JSON line out
CHILD = r"""
import json, sys, time
import numpy as np
import s2core
from s2core.kit.prompts import mixed_prompt, semantic_frame
path, backend, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
m = s2core.load(path, backend=backend)
hp, rng = m.hparams, np.random.default_rng(0)
prompt = mixed_prompt(hp, 256, rng)
m.init_kv_cache(len(prompt) + steps + 8)
t = time.perf_counter(); m.prefill(prompt); prefill = time.perf_counter() - t
frame = semantic_frame(hp, rng)
times = []
for _ in range(steps + 3):
    t = time.perf_counter(); m.step(frame); times.append(time.perf_counter() - t)
print(json.dumps({"prefill_ms": prefill * 1e3, "step_ms": float(np.median(times[3:])) * 1e3,
                  "step_min_ms": min(times) * 1e3}))
"""


def run_child(root: Path, model: Path, backend: str, steps: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(model), backend, str(steps)],
                          env=tree_env(root), cwd=root, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="the git revision to compare with")
    ap.add_argument("--type", default="f16")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=22)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)

    cfg = BenchConfig(layers=args.layers)
    model = Path(prepare_model(cfg.hparams(), args.type, seed=0, prefill_tokens=256).path)
    other = revision(args.against)
    rows: dict[str, list[dict]] = {"this tree": [], other: []}
    with worktree(args.against) as checkout:
        for k in range(args.runs):
            for name, root in (("this tree", ROOT), (other, checkout)):
                rows[name].append(run_child(root, model, args.backend, args.steps))
                r = rows[name][-1]
                print(f"run {k + 1} {name:>9}: prefill {r['prefill_ms']:7.0f} ms, "
                      f"step {r['step_ms']:6.1f} ms (min {r['step_min_ms']:.1f})",
                      flush=True)

    info = machine.describe()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    report = {"schema": "s2core-step-ab/1", "when": stamp, "machine": info,
              "model": {"type": args.type, "layers": args.layers, "path": str(model)},
              "backend": args.backend, "against": other, "runs": rows}
    lines = [f"# Decode step and prefill: this tree against {other}", "",
             f"{args.type}, {args.layers} S2 Pro-shaped layers, backend {args.backend}; "
             f"{args.runs} alternated runs, each a fresh process: prefill of 256 positions, "
             f"median of {args.steps} decode steps (context 256).", "",
             "| revision | prefill ms (runs) | step ms (runs) | step median of runs |",
             "|---|---|---|---:|"]
    for name, rs in rows.items():
        prefills = " / ".join(f"{r['prefill_ms']:.0f}" for r in rs)
        steps = " / ".join(f"{r['step_ms']:.1f}" for r in rs)
        middle = statistics.median(r["step_ms"] for r in rs)
        lines.append(f"| {name} | {prefills} | {steps} | {middle:.1f} |")
    write_report(args.out, "step-ab", machine.machine_tag(info), report, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
