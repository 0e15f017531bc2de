"""A slow or hanging probe delays only what needs it (issue 22): probes run side by side, the
other rows are shown as they answer, a command that names its backend probes that one only,
and the slow one costs the documented limit once per process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

import s2core
from s2core.contract.registry import ENV_PLUGINS, ENV_PROBE_TIMEOUT, Registry, get_registry

HANGING_PLUGIN = """
import time
from s2core.contract.plugin_spec import BackendSpec, Probe, hookimpl

def probe():
    time.sleep(600)
    return Probe(True, "late")

@hookimpl
def s2core_backends():
    return [BackendSpec("hangs", "s2core_numpy.backend:NumpyBackend", probe, priority=1000)]
"""


@pytest.fixture
def hanging_plugin(tmp_path, monkeypatch):
    (tmp_path / "p_hangs.py").write_text(textwrap.dedent(HANGING_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv(ENV_PLUGINS, "p_hangs")
    monkeypatch.setenv(ENV_PROBE_TIMEOUT, "3")
    get_registry().refresh()
    yield
    get_registry().refresh()


def test_rows_come_as_probes_answer_and_the_hung_one_times_out_once(hanging_plugin):
    reg = Registry(["s2core_numpy.plugin", "p_hangs"], entry_point_group=None,
                   env_plugins=False, probe_timeout=2.0)
    start = time.monotonic()
    seen = []
    rows = reg.list(on_row=lambda r: seen.append((r.name, time.monotonic() - start)))
    when = dict(seen)
    assert when["numpy"] < 1.5, seen  # shown before the hung probe's limit
    assert 1.9 <= when["hangs"] < 4, seen
    assert "timed out" in {r.name: r for r in rows}["hangs"].reason
    again = time.monotonic()
    reg.list()
    reg.default()
    assert time.monotonic() - again < 0.5  # once per process: the answer is kept


def test_naming_a_backend_probes_only_that_one(hanging_plugin, tiny_model):
    start = time.monotonic()
    s2core.load(tiny_model, backend="numpy").close()
    assert time.monotonic() - start < 2.5  # the hung probe's 3 s were never waited for
    start = time.monotonic()
    assert s2core.default_backend() == "numpy"  # auto-selection: the limit, once
    assert 2.9 <= time.monotonic() - start < 6
    start = time.monotonic()
    assert s2core.default_backend() == "numpy"
    assert time.monotonic() - start < 0.5


def test_the_cli_shows_the_others_before_the_hung_one(hanging_plugin, monkeypatch):
    monkeypatch.setenv(ENV_PROBE_TIMEOUT, "8")  # room for the process's imports on a busy host
    proc = subprocess.Popen([sys.executable, "-m", "s2core.cli", "backends"],
                            stdout=subprocess.PIPE, text=True)
    start = time.monotonic()
    first = proc.stdout.readline()
    shown_after = time.monotonic() - start
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == 0
    assert shown_after < 7.5, (shown_after, first)  # before the 8 s limit (imports included)
    assert "hangs" not in first
    assert "probe timed out" in rest and "default: numpy" in rest
