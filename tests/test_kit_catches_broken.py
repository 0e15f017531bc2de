"""The conformance kit fails each deliberately broken backend (tests/broken_backends), with a
message naming the rule it breaks, and passes the unbroken example (and NumPy) backend.

The kit runs as a third party runs it: a test module subclassing BackendConformance, in a
separate pytest process, with the broken backends registered through
$S2CORE_PLUGINS. Only the rule tests run (s2core/kit/rules.py) and, for the batching rules,
the one batching test each broken backend must fail (s2core/kit/batching.py); the numbers
against the reference are the rest of the kit's business.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from s2core.kit import batching_rules as kb
from s2core.kit.batching import BatchingConformance
from s2core.kit.codec_conformance import CODEC_RULES, CODEC_STATE_KEPT, CodecConformance
from s2core.kit.rules import (BACKEND_ERRORS, CACHE_BYTES_HOLD, CACHE_DTYPE_HOLDS,
                              COMPUTE_DTYPE_HOLDS, CONCURRENCY, FAST_AR_OWN_HPARAMS, LIFE_CYCLE,
                              LOGIT_ROWS,
                              OPTIONS_DECLARED, RESULTS_UNCHANGED, RULES, SNAPSHOTS_ARE_COPIES,
                              WEIGHT_BYTES_HOLD, rule_message)

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
    # issue 22 (kit_broken_declared.py): claims the core sizes memory and picks by
    "broken_cache_storage_understated": ("declared_kv_cache_bytes_hold", CACHE_BYTES_HOLD),
    "broken_claims_mapped_but_copies": ("declared_weight_holding_holds", WEIGHT_BYTES_HOLD),
    # invalid loaded capabilities are refused by load(): every test fails at its first load,
    # naming its own rule and the refusal (DETAIL)
    "broken_loaded_cache_type_f12": ("declared_kv_cache_dtype_holds", CACHE_DTYPE_HOLDS),
    "broken_loaded_negative_batch": ("declared_kv_cache_dtype_holds", CACHE_DTYPE_HOLDS),
    # foreign exceptions on valid input reach the kit as s2core errors naming the call
    "broken_key_error_in_allocate": ("backend_failures_reach_users_as_s2core_errors",
                                     BACKEND_ERRORS),
    "broken_index_error_in_eval": ("backend_failures_reach_users_as_s2core_errors",
                                   BACKEND_ERRORS),
    # only hidden is shared: the rule compares it, on different inputs per thread
    "broken_global_scratch_hidden": ("threads_never_interleave", CONCURRENCY),
    # the logit-rows rule (kit_broken_logit_rows.py)
    "broken_rows_declared_all_returned": ("logit_rows_are_rows_of_the_full_logits", LOGIT_ROWS),
    "broken_rows_shifted": ("logit_rows_are_rows_of_the_full_logits", LOGIT_ROWS),
    "broken_slots_take_the_first_rows": ("logit_rows_are_rows_of_the_full_logits", LOGIT_ROWS),
}
#: broken backend -> text its failure must also hold (what the user is told)
DETAIL = {
    "broken_loaded_cache_type_f12": "declares invalid capabilities once loaded: "
                                    "kv_cache_dtype='f12'",
    "broken_loaded_negative_batch": "declares invalid capabilities once loaded: "
                                    "max_batch_sequences=-3",
    "broken_key_error_in_allocate": "CacheAllocationError",
    "broken_index_error_in_eval": "failed in eval_cached(n_past=10, n_tokens=1): IndexError",
    "broken_global_scratch_hidden": "to give the hidden it gives alone",
    "broken_rows_declared_all_returned": "shape (",
    "broken_slots_take_the_first_rows": "eval_slots call 0, slot 1",
}
CONTROL = "example"

#: broken backend (kit_broken_batching.py) -> the batching test that must fail, with its rule.
#: The checks of BatchedModel's arguments (kb.SLOT_CHECKS) and the refusal of slots beyond
#: kv_cache_limit_bytes are the core's, for every backend; keeping the previous slots when an
#: allocation fails is the backend's.
BATCH_EXPECTED = {
    "broken_batch_without_methods": ("test_batching_capability_is_backed_by_methods",
                                     kb.SLOT_METHODS),
    "broken_sharing_without_methods": ("test_batching_capability_is_backed_by_methods",
                                       kb.SLOT_METHODS),
    "broken_batch_results_in_slot_order": ("test_slots_equal_sequences_alone", kb.SLOTS_ALONE),
    "broken_batch_counts_the_calls_rows": ("test_slots_advance_by_their_own_rows", kb.OWN_ROWS),
    "broken_batch_keeps_positions_on_reuse": ("test_slots_join_leave_and_are_reused",
                                              kb.JOIN_LEAVE),
    "broken_batch_keeps_prefix_after_reset": ("test_slots_join_leave_and_are_reused",
                                              kb.JOIN_LEAVE),
    "broken_batch_alias_results": ("test_slot_results_unchanged_after_later_calls",
                                   kb.SLOT_RESULTS_KEPT),
    "broken_batch_alias_fast": ("test_slot_results_unchanged_after_later_calls",
                                kb.SLOT_RESULTS_KEPT),
    "broken_batch_four_slots_at_most": ("test_declared_max_batch_sequences_holds", kb.MAX_BATCH),
    "broken_batch_fast_first_row_codes": ("test_fast_decode_batch_equals_rows_alone",
                                          kb.FAST_BATCH),
    "broken_batch_writes_shared_prefix": ("test_shared_prefix_unchanged_by_its_slots",
                                          kb.PREFIX_UNCHANGED),
    "broken_batch_reads_own_rows_only": ("test_slots_start_with_a_shared_prefix",
                                         kb.SHARED_PREFIX),
    "broken_batch_loses_slots_on_failed_init": ("test_slots_beyond_the_memory_limit_are_refused",
                                                kb.SLOT_MEMORY),
    "broken_batch_removes_another_voice": ("test_a_released_voice_frees_only_itself",
                                           kb.VOICE_RELEASED),
    "broken_batch_keeps_removed_voice": ("test_a_released_voice_frees_only_itself",
                                         kb.VOICE_RELEASED),
    "broken_batch_slot_snapshot_views": ("test_slot_snapshots_are_copies", kb.SLOT_SNAPSHOTS),
    "broken_batch_drifts": ("test_slots_equal_sequences_alone", kb.SLOTS_ALONE),
    "broken_batch_shares_prefix_but_copies": ("test_a_shared_voice_is_held_once",
                                              kb.VOICE_HELD_ONCE),
}
#: the unbroken backends every batching test must pass: NumPy (which the broken ones vary)
#: and the example (one slot, the core's fallback)
BATCH_CONTROLS = ("numpy", "example")
#: (control, batching test) skipped by design: the example declares no shared voices
BATCH_SKIPS = {("example", "test_a_shared_voice_is_held_once")}
BATCH_TESTS = sorted(name for name in dir(BatchingConformance) if name.startswith("test_"))
#: broken codec (kit_broken_codec.py) -> the codec test that must fail, with its rule
CODEC_EXPECTED = {
    "broken_codec_mutates_stream_state": ("test_rule_codec_stream_state_is_never_modified",
                                          CODEC_STATE_KEPT),
}
#: honest codecs every codec test must pass or skip: NumPy's, and one without an encoder
#: (the kit once failed its bad-audio test instead of skipping it)
CODEC_CONTROLS = ("numpy", "broken_codec_without_encoder")
CODEC_TESTS = sorted(name for name in dir(CodecConformance) if name.startswith("test_"))
CODEC_MODULE = """
from s2core.kit.codec_conformance import CodecConformance

class TestThirdPartyBackend(CodecConformance):
    pass
"""
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
    return _run_kit(tmp_path_factory.mktemp("kit"), ["-k", "test_rule", "test_third_party.py"],
                    [*EXPECTED, CONTROL])


@pytest.fixture(scope="module")
def batch_report(tmp_path_factory):
    """As kit_report, for each broken batching backend's one test and every batching test
    on the controls."""
    if importlib.util.find_spec("s2core_example") is None:
        pytest.skip("s2core-example is not installed (pip install ./plugins/s2core-example): "
                    "the broken backends are variations of it and of NumPy")
    node = "test_third_party.py::TestThirdPartyBackend::{}[{}]"
    ids = [node.format(test, broken) for broken, (test, _) in BATCH_EXPECTED.items()]
    ids += [node.format(test, control) for control in BATCH_CONTROLS for test in BATCH_TESTS]
    return _run_kit(tmp_path_factory.mktemp("kit-batching"), ids,
                    [*BATCH_EXPECTED, *BATCH_CONTROLS])


@pytest.fixture(scope="module")
def codec_report(tmp_path_factory):
    """As kit_report, for the codec kit on the broken codec and the controls."""
    return _run_kit(tmp_path_factory.mktemp("kit-codec"), ["test_third_party.py"],
                    [*CODEC_EXPECTED, *CODEC_CONTROLS], CODEC_MODULE)


def _run_kit(folder: Path, selection: list[str], backends: list[str], module: str = KIT_MODULE
             ) -> dict[tuple[str, str], tuple[str, str]]:
    (folder / "test_third_party.py").write_text(module)
    env = dict(os.environ, S2CORE_PLUGINS="kit_broken_plugin",
               PYTHONPATH=os.pathsep.join([str(BROKEN_DIR), os.environ.get("PYTHONPATH", "")]))
    args = [sys.executable, "-m", "pytest", "-p", "s2core.kit.pytest_plugin", "-p",
            "no:cacheprovider", "-q", "--junitxml", str(folder / "kit.xml"), *selection]
    for name in backends:
        args += ["--s2core-backend", name]
    run = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert (folder / "kit.xml").exists(), run.stdout[-3000:] + run.stderr[-3000:]
    report = {}
    for case in ET.parse(folder / "kit.xml").getroot().iter("testcase"):
        test, _, params = case.get("name").partition("[")
        ids = params.rstrip("]").split("-")  # a parametrized test's ids, the backend's among them
        backend = next((b for b in backends if b in ids), params.rstrip("]"))
        failure = case.find("failure")
        error = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            outcome = ("failed", failure.get("message", "") + (failure.text or ""))
        elif error is not None:
            outcome = ("error", error.get("message", "") + (error.text or ""))
        else:
            outcome = ("skipped" if skipped is not None else "passed", "")
        # a parametrized test's cases on one backend count as one outcome, the worst
        key = (test.removeprefix("test_rule_"), backend)
        report[key] = _worst(report.get(key), outcome)
    return report


def _worst(before: tuple[str, str] | None, now: tuple[str, str]) -> tuple[str, str]:
    """Of two outcomes of one test on one backend, the one to report (a failure first)."""
    order = ("failed", "error", "passed", "skipped")
    if before is None:
        return now
    return min(before, now, key=lambda o: order.index(o[0]))


def assert_failed_naming(outcome: str, message: str, broken: str, test: str,
                         named: str) -> None:
    """The kit test failed, and its message starts by naming the rule (`named`)."""
    assert outcome == "failed", f"{broken}: {test} {outcome}"
    assert named in message, message[:2000]


@pytest.mark.parametrize("broken", sorted(EXPECTED))
def test_the_kit_fails_each_broken_backend_naming_the_rule(kit_report, broken):
    test, rule = EXPECTED[broken]
    outcome, message = kit_report[(test, broken)]
    assert_failed_naming(outcome, message, broken, test, rule_message(rule, "", RULES))
    assert DETAIL.get(broken, "") in message, message[:2000]


def test_the_unbroken_example_passes_every_rule(kit_report):
    ran = {test: outcome for (test, backend), outcome in kit_report.items() if backend == CONTROL}
    assert len(ran) == len(RULES)
    assert all(o == "passed" for o, _ in ran.values()), ran


@pytest.mark.parametrize("broken", sorted(BATCH_EXPECTED))
def test_the_kit_fails_each_broken_batching_backend_naming_the_rule(batch_report, broken):
    test, rule = BATCH_EXPECTED[broken]
    outcome, message = batch_report[(test, broken)]
    assert_failed_naming(outcome, message, broken, test,
                         rule_message(rule, "", kb.BATCHING_RULES))


@pytest.mark.parametrize("control", BATCH_CONTROLS)
def test_the_unbroken_backends_pass_every_batching_test(batch_report, control):
    ran = {test: outcome for (test, backend), outcome in batch_report.items()
           if backend == control}
    assert sorted(ran) == BATCH_TESTS
    assert all(o == "passed" or (control, test) in BATCH_SKIPS for test, (o, _) in ran.items()), ran


def test_every_batching_rule_has_a_broken_backend():
    """Two rules have none of their own: the checks of BatchedModel's arguments run in the
    core before any backend call, and the server's requests are made of the slot calls the
    other rules check (a backend that breaks those breaks the server's too)."""
    without = {kb.SLOT_CHECKS, kb.SERVED}
    assert {rule for _, rule in BATCH_EXPECTED.values()} | without == set(kb.BATCHING_RULES)


@pytest.mark.parametrize("broken", sorted(CODEC_EXPECTED))
def test_the_codec_kit_fails_each_broken_codec_naming_the_rule(codec_report, broken):
    test, rule = CODEC_EXPECTED[broken]
    outcome, message = codec_report[(test.removeprefix("test_rule_"), broken)]
    assert_failed_naming(outcome, message, broken, test, rule_message(rule, "", CODEC_RULES))


@pytest.mark.parametrize("control", CODEC_CONTROLS)
def test_honest_codecs_pass_the_codec_kit(codec_report, control):
    ran = {test: outcome for (test, backend), outcome in codec_report.items()
           if backend == control}
    assert len(ran) == len(CODEC_TESTS), sorted(ran)
    assert all(o in ("passed", "skipped") for o, _ in ran.values()), ran
    if control == "broken_codec_without_encoder":
        assert ran["test_bad_audio"][0] == "skipped", ran["test_bad_audio"]
