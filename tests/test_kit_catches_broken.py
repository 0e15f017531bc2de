"""The conformance kit fails each deliberately broken backend (tests/broken_backends), with a
message naming the rule it breaks, and passes the unbroken example backend.

The kit runs as a third party runs it: a test module subclassing BackendConformance, in a
separate pytest process, with the broken backends registered through
$S2CORE_PLUGINS. Only the rule tests run (s2core/kit/rules.py); the numbers against the
reference are the rest of the kit's business.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from s2core.kit.rules import (CACHE_DTYPE_HOLDS, COMPUTE_DTYPE_HOLDS, CONCURRENCY,
                              FAST_AR_OWN_HPARAMS, LIFE_CYCLE, OPTIONS_DECLARED,
                              RESULTS_UNCHANGED, RULES, SNAPSHOTS_ARE_COPIES)

BROKEN_DIR = Path(__file__).parent / "broken_backends"

#: broken backend -> the rule test that must fail, with the rule's name in its message
EXPECTED = {
    "broken_alias_results": ("results_unchanged_after_later_calls", RESULTS_UNCHANGED),
    "broken_alias_fast": ("results_unchanged_after_later_calls", RESULTS_UNCHANGED),
    "broken_view_snapshots": ("snapshots_are_copies", SNAPSHOTS_ARE_COPIES),
    "broken_numpy_old_snapshots": ("snapshots_are_copies", SNAPSHOTS_ARE_COPIES),
    "broken_fast_slow_rope": ("fast_ar_uses_its_own_hparams", FAST_AR_OWN_HPARAMS),
    "broken_fast_slow_eps": ("fast_ar_uses_its_own_hparams", FAST_AR_OWN_HPARAMS),
    "broken_fast_slow_heads": ("fast_ar_uses_its_own_hparams", FAST_AR_OWN_HPARAMS),
    "broken_f16_declared_f32_held": ("declared_kv_cache_dtype_holds", CACHE_DTYPE_HOLDS),
    "broken_f32_declared_f16_held": ("declared_kv_cache_dtype_holds", CACHE_DTYPE_HOLDS),
    "broken_half_declared": ("declared_compute_dtype_holds", COMPUTE_DTYPE_HOLDS),
    "broken_f32_declared_half_results": ("declared_compute_dtype_holds", COMPUTE_DTYPE_HOLDS),
    "broken_option_not_taken": ("options_declared_and_checked", OPTIONS_DECLARED),
    "broken_option_undeclared": ("options_declared_and_checked", OPTIONS_DECLARED),
    "broken_option_ignored": ("options_declared_and_checked", OPTIONS_DECLARED),
    "broken_option_accepts_anything": ("options_declared_and_checked", OPTIONS_DECLARED),
    # One model's calls are serialized by the core's guard for every backend, so no backend
    # can break that half of the rule; sharing state between instances is the backend's own.
    "broken_shared_call_state": ("threads_never_interleave", CONCURRENCY),
    # ModelClosedError after close() and the refusal of caches beyond kv_cache_limit_bytes
    # are the core's, for every backend; releasing the weights and allocating the new cache
    # before dropping the old are the backend's.
    "broken_keeps_weights_on_close": ("close_releases_and_failed_init_keeps_the_cache",
                                      LIFE_CYCLE),
    "broken_loses_cache_on_failed_init": ("close_releases_and_failed_init_keeps_the_cache",
                                          LIFE_CYCLE),
}
CONTROL = "example"
KIT_MODULE = """
from s2core.kit.conformance import BackendConformance

class TestThirdPartyBackend(BackendConformance):
    pass
"""


@pytest.fixture(scope="module")
def kit_report(tmp_path_factory):
    """Outcome and failure message of every rule test on every broken backend and the control,
    from one pytest run in a subprocess."""
    if importlib.util.find_spec("s2core_example") is None:
        pytest.skip("s2core-example is not installed (pip install ./plugins/s2core-example): "
                    "the broken backends are variations of it")
    return _run_kit(tmp_path_factory.mktemp("kit"))


def _run_kit(folder: Path) -> dict[tuple[str, str], tuple[str, str]]:
    (folder / "test_third_party.py").write_text(KIT_MODULE)
    env = dict(os.environ, S2CORE_PLUGINS="kit_broken_plugin",
               PYTHONPATH=os.pathsep.join([str(BROKEN_DIR), os.environ.get("PYTHONPATH", "")]))
    args = [sys.executable, "-m", "pytest", "-p", "s2core.kit.pytest_plugin", "-p",
            "no:cacheprovider", "-q", "-k", "test_rule", "--junitxml", str(folder / "kit.xml"),
            "test_third_party.py"]
    for name in [*EXPECTED, CONTROL]:
        args += ["--s2core-backend", name]
    run = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert (folder / "kit.xml").exists(), run.stdout[-3000:] + run.stderr[-3000:]
    report = {}
    for case in ET.parse(folder / "kit.xml").getroot().iter("testcase"):
        test, _, backend = case.get("name").partition("[")
        failure = case.find("failure")
        error = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            outcome = ("failed", failure.get("message", "") + (failure.text or ""))
        elif error is not None:
            outcome = ("error", error.get("message", "") + (error.text or ""))
        else:
            outcome = ("skipped" if skipped is not None else "passed", "")
        report[(test.removeprefix("test_rule_"), backend.rstrip("]"))] = outcome
    return report


@pytest.mark.parametrize("broken", sorted(EXPECTED))
def test_the_kit_fails_each_broken_backend_naming_the_rule(kit_report, broken):
    test, rule = EXPECTED[broken]
    outcome, message = kit_report[(test, broken)]
    assert outcome == "failed", f"{broken}: {test} {outcome}"
    assert f"rule '{rule}' ({RULES[rule]})" in message, message[:2000]


def test_the_unbroken_example_passes_every_rule(kit_report):
    ran = {test: outcome for (test, backend), outcome in kit_report.items() if backend == CONTROL}
    assert len(ran) == len(RULES)
    assert all(o == "passed" for o, _ in ran.values()), ran
