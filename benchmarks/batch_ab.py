#!/usr/bin/env python
"""A change's effect on the batch case (frames per second of B concurrent sequences through
the server), against another revision.

    python benchmarks/batch_ab.py --against REV [--types q4_k_m] [--sizes 1,4,8] [--runs 2]
                                  [--backend numpy] [--layers 4] [--frames 4] [--rounds 3]

Runs `s2core bench --case batch` (s2core/benchmarking/batch.py says what it times) from this
tree and from REV checked out beside it (ab.py), alternately, each in a fresh process; then
tabulates each run's frames/s and speedups against one sequence side by side. The speedup
of a size within one run is itself a ratio taken under the same drift (batch.py interleaves
the sizes); the alternation compares the two trees.
Results go to benchmarks/results/batch-ab-<date>-<time>-<machine tag>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from ab import revision, tree_env, worktree, write_report  # noqa: E402
from s2core.benchmarking import machine  # noqa: E402


def run_bench(tree: Path, args: argparse.Namespace, out: Path) -> dict:
    """One `s2core bench --case batch` run of `tree`; its JSON report."""
    subprocess.run([sys.executable, "-m", "s2core.cli.main", "bench", "--case", "batch",
                    "--types", args.types, "--backends", args.backend, "--sizes", args.sizes,
                    "--layers", str(args.layers), "--frames", str(args.frames), "--rounds",
                    str(args.rounds), "--out", str(out)],
                   env=tree_env(tree), cwd=tree, check=True, stdout=subprocess.DEVNULL)
    (report,) = out.glob("batch-*.json")
    return json.loads(report.read_text())


def size_rows(report: dict) -> dict[tuple[str, int], dict]:
    """(weight type, sequences) -> the bench's row for it."""
    return {(r["weight_type"], s["sequences"]): s
            for r in report["results"] for s in r.get("sizes", [])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="the git revision to compare with")
    ap.add_argument("--types", default="q4_k_m")
    ap.add_argument("--sizes", default="1,4,8")
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--frames", type=int, default=4,
                    help="timed frames of every request per size and round (the bench's 4)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds over the sizes in each run (the bench's 3)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)

    other = revision(args.against)
    names = ("this tree", other)
    reports: dict[str, list[dict]] = {name: [] for name in names}
    with worktree(args.against) as checkout, tempfile.TemporaryDirectory() as tmp:
        for k in range(args.runs):
            # ABBA: a drift within a pair (the machine warming, a neighbour's load) then
            # favours each tree alike
            pair = list(zip(names, (ROOT, checkout)))
            for name, tree in pair if k % 2 == 0 else pair[::-1]:
                out = Path(tmp) / f"{k}-{len(reports[name])}-{name.replace(' ', '-')}"
                reports[name].append(run_bench(tree, args, out))
                rows = size_rows(reports[name][-1])
                print(f"run {k + 1} {name:>9}: " + ", ".join(
                    f"{t} B={b} {r['frames_per_s']:.2f}/s ({r['speedup']:.2f}x)"
                    for (t, b), r in rows.items()), flush=True)

    info = machine.describe()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    report = {"schema": "s2core-batch-ab/1", "when": stamp, "machine": info,
              "against": other, "args": vars(args), "reports": reports}
    lines = [f"# Batch case: this tree against {other}", "",
             f"`s2core bench --case batch --types {args.types} --backends {args.backend} "
             f"--sizes {args.sizes} --layers {args.layers} --frames {args.frames} --rounds "
             f"{args.rounds}`, {args.runs} alternated runs "
             f"of each tree ({names[0]} first in odd runs, second in even ones), each a fresh "
             "process. A cell: frames/s (against one sequence in the same run), step ms / "
             "Fast-AR ms a frame.", "",
             "| type | B | " + " | ".join(f"{n} run {k + 1}" for k in range(args.runs)
                                          for n in names) + " |",
             "|---|---:|" + "---|" * (2 * args.runs)]
    per_tree = {name: [size_rows(r) for r in rs] for name, rs in reports.items()}
    for key in per_tree[names[0]][0]:
        cells = []
        for k in range(args.runs):
            for name in names:
                r = per_tree[name][k].get(key)
                cells.append("-" if r is None else
                             f"{r['frames_per_s']:.2f} ({r['speedup']:.2f}x) "
                             f"{r['step_ms']:.1f} / {r['fast_ms']:.0f}")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    lines += ["", f"Machine: {info.get('cpu_model', '?')}; flags recorded in the JSON."]
    write_report(args.out, "batch-ab", machine.machine_tag(info), report, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
