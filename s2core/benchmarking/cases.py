"""What the voice and batch cases share: one child process per backend and type (each
measures with a fresh interpreter and its own thread pools), the machine's load around a run,
and the JSON + Markdown (+ chart) a case leaves in the results folder."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from s2core.benchmarking.machine import numba_target, summary_lines


def load_average() -> tuple[float, ...]:
    return os.getloadavg() if hasattr(os, "getloadavg") else ()


def run_child(case: str, spec: dict[str, Any], tmp: str, env: dict[str, str],
              timeout: float) -> dict[str, Any]:
    """Run `python -m s2core.benchmarking.<case> SPEC RESULT` and read its result; a timeout
    or a child that wrote nothing becomes an error row."""
    spec_path = Path(tmp) / f"{case}-spec.json"
    result_path = Path(tmp) / f"{case}-result-{spec['backend']}-{spec['weight_type']}.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", f"s2core.benchmarking.{case}", str(spec_path), str(result_path)]
    ids = {"backend": spec["backend"], "weight_type": spec["weight_type"]}
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout, stdout=sys.stderr)
    except subprocess.TimeoutExpired:
        return {**ids, "status": "error", "error": f"timed out after {timeout:.0f} s"}
    if result_path.exists():
        return json.loads(result_path.read_text())
    return {**ids, "status": "error",
            "error": f"child exited with code {proc.returncode} and wrote no result"}


def child_main(measure: Callable[[dict[str, Any]], dict[str, Any]],
               argv: list[str] | None = None) -> int:
    """The child's side of `run_child`: argv = SPEC RESULT."""
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    result = measure(spec)
    result["numba_target"] = numba_target()  # which kernels ran (--avx2)
    Path(argv[1]).write_text(json.dumps(result, indent=1))
    return 0


def write_case_outputs(case: str, report: dict[str, Any], out_dir: Path, lines: list[str],
                       chart: Callable[[dict[str, Any], Path], None] | None = None) -> int:
    """<case>-<date>-<time>-<machine>.json and .md (and .png when `chart` draws one); prints
    the tables; 0 when every row measured."""
    out_dir.mkdir(parents=True, exist_ok=True)
    created = dt.datetime.fromisoformat(report["created"])
    quick = "-quick" if report["config"]["quick"] else ""
    stem = out_dir / f"{case}-{created:%Y%m%d-%H%M}-{report['machine_tag']}{quick}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    png = stem.with_suffix(".png")
    if chart is not None:
        chart(report, png)
        if png.exists():
            lines = lines + ["", f"![{case}]({png.name})"]
    machine = ["", "## Machine", ""] + [f"- {line}" for line in summary_lines(report["machine"])]
    stem.with_suffix(".md").write_text(f"# s2core bench --case {case}\n\n"
                                       + "\n".join(lines + machine) + "\n")
    print("\n".join(lines))
    print(f"\nwrote {stem}.json, {stem}.md" + (f", {png}" if png.exists() else ""))
    ok = report["results"] and all(r["status"] == "ok" for r in report["results"])
    return 0 if ok else 1
