"""What the A/B scripts (step_ab.py, batch_ab.py) share: another revision checked out beside
the working tree, the environment that makes a child process import a given tree, and the
writing of a comparison's JSON and markdown.

On this kind of VM the same measurement drifts by 15-50 % within minutes, so a figure taken
once before a change and once after says little; these scripts run both trees alternately,
each in a fresh process, under the same drift."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]


def revision(rev: str, root: Path = ROOT) -> str:
    """The short hash of `rev`."""
    return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", rev],
                          capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def worktree(rev: str, root: Path = ROOT) -> Iterator[Path]:
    """`rev` checked out in a temporary git worktree, removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        checkout = Path(tmp) / "against"
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "-q",
                        str(checkout), rev], check=True)
        try:
            yield checkout
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force",
                            str(checkout)], check=False)


def tree_env(tree: Path) -> dict[str, str]:
    """os.environ with `tree`'s packages (s2core, and the backends) first on the path."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "backends")]))


def paired_ratio(these: list[float], those: list[float]) -> dict:
    """The median of the rounds' own ratios these / those, with their range: a round's two
    runs are neighbours in time, so each ratio sees one drift of the machine."""
    ratios = sorted(a / b for a, b in zip(these, those))
    return {"ratio": statistics.median(ratios), "ratio_range": [ratios[0], ratios[-1]]}


def write_report(out: str | Path, kind: str, tag: str, report: dict, lines: list[str]) -> Path:
    """report as out/<kind>-<report["when"]>-<tag>.json and `lines` as its .md; prints the
    lines and where they went. Returns the stem."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{kind}-{report['when']}-{tag}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwrote {stem}.json, .md")
    return stem


def write_machine_report(out: str | Path, kind: str, report: dict, lines: list[str],
                         tag_prefix: str = "") -> Path:
    """`report` and its tables `lines` with what every benchmark records of the machine it
    ran on: the time (which names the file), machine.describe(), the CPU model and flags;
    written by write_report as out/<kind>-<when>-<tag_prefix><machine tag>, the machine's
    summary after `lines`."""
    from s2core.benchmarking import machine  # the running tree's, imported when it reports
    info = machine.describe()
    report = {"when": dt.datetime.now().strftime("%Y%m%d-%H%M"), **report, "machine": info,
              "cpu_model": machine.cpu_model(), "cpu_flags": machine.cpu_flags()}
    return write_report(out, kind, tag_prefix + machine.machine_tag(info), report,
                        [*lines, "", *machine.summary_lines(info)])
