"""Every rule of the kits, and which rule each kit test checks (docs/kit-rules.md lists them).

The rule tests (rules.py, declared.py, faults.py, batching.py, voices_serving.py,
voice_release.py, codec_conformance.py) fail with messages that start with their rule's id.
The tests that compare numbers with the reference, and the other checks written as plain
asserts, check a rule too: TEST_RULES names it, and s2core's pytest plugin
(s2core/kit/pytest_plugin.py) starts each such failure with it, so every kit failure names
the rule broken.
"""

from __future__ import annotations

from s2core.kit.batching_rules import BATCHING_RULES
from s2core.kit.codec_conformance import CODEC_RULES
from s2core.kit.rules import LOGIT_ROWS, RESULTS_UNCHANGED, RULES

MATCHES_REFERENCE = "matches-the-reference"
SAME_ON_EVERY_PATH = "same-numbers-on-every-path"
TOKEN_ROWS = "token-rows-as-specified"
BAD_INPUT = "bad-input-refused-and-nothing-changes"
PREFIX = "voice-prefixes-restore-bit-for-bit"
STREAM = "stream-equals-generate"
ARITHMETIC = "each-declared-arithmetic-matches-its-reference"
CODEC_DECLARED = "codec-declared-by-probe-and-plugin"
CODEC_REFERENCE = "codec-matches-the-reference"
CODEC_STREAMS = "codec-streams-equal-one-shot"
CODEC_ENCODE = "codec-encode-matches-the-reference"
CODEC_BAD_INPUT = "codec-bad-input-refused"
CODEC_CLOSE = "codec-close-releases"

#: the rules of the plain-assert tests: id -> what it asks
CHECKED_RULES = {
    MATCHES_REFERENCE: "hidden, logits, Fast-AR logits and K/V match the float64 reference "
                       "within the bound of the declared compute and cache types, for every "
                       "kit model and weight type, and for every offered cache type",
    SAME_ON_EVERY_PATH: "chunked and unchunked prefill, prefill then steps, any order of "
                        "Fast-AR calls, reset and clear then reuse give the same numbers",
    TOKEN_ROWS: "text rows ignore their code slots; semantic rows' codes change the result",
    BAD_INPUT: "every bad input raises its named InvalidInputError (or CacheOverflowError, "
               "CacheNotInitializedError) and leaves n_past and the cache as they were",
    PREFIX: "writes_kv_cache matches write_kv_cache; a saved prefix restores bit for bit "
            "into any later synthesis, and refusals change nothing",
    STREAM: "stream() gives generate()'s codes and frees the cache at its end",
    ARITHMETIC: "every arithmetic in Capabilities.arithmetics besides 'f32' loads, says so "
                "in the model's capabilities, and matches the float64 reference computed in "
                "that arithmetic (for 'ggml': activations rounded as ggml rounds them)",
    CODEC_DECLARED: "a codec is declared by both the probe (Capabilities.codec) and the plugin "
                    "(codec_class), and the loaded codec's capabilities are the probe's",
    CODEC_REFERENCE: "decode matches CODEC.md's float64 reference within the declared "
                     "precision's bound, from either container, with out-of-range codes "
                     "clamped as s2.cpp does",
    CODEC_STREAMS: "pushes of any sizes give one-shot decode's audio (exact streaming), or "
                   "its windowed approximation; reset and empty pushes behave",
    CODEC_ENCODE: "encode (when declared) gives the reference's codes away from near-ties, "
                  "for whole frames and short audio",
    CODEC_BAD_INPUT: "bad codes and bad audio raise their named InvalidInputError; a failed "
                     "push changes nothing",
    CODEC_CLOSE: "close() is idempotent and every later call raises CodecClosedError",
}

#: every rule of the kits: id -> what it asks
ALL_RULES = {**RULES, **BATCHING_RULES, **CODEC_RULES, **CHECKED_RULES}

#: plain-assert kit test -> the rule it checks
TEST_RULES = {
    **dict.fromkeys(("test_prefill_matches_reference", "test_steps_match_reference",
                     "test_fast_decode_matches_reference", "test_kv_cache_dtypes"),
                    MATCHES_REFERENCE),
    **dict.fromkeys(("test_fast_decode_in_any_call_order", "test_chunked_prefill_equals_unchunked",
                     "test_prefill_then_steps_equals_one_prefill", "test_reset_then_reuse",
                     "test_clear_then_init"), SAME_ON_EVERY_PATH),
    **dict.fromkeys(("test_text_code_slots_have_no_effect", "test_semantic_codes_do_matter"),
                    TOKEN_ROWS),
    **dict.fromkeys(("test_eval_before_init_raises", "test_fill_to_capacity_then_overflow",
                     "test_bad_input_leaves_model_unchanged", "test_fast_decode_bad_input"),
                    BAD_INPUT),
    **dict.fromkeys(("test_writes_kv_cache_capability_matches_the_method",
                     "test_restored_prefix_is_bit_identical",
                     "test_prefix_restores_into_many_syntheses", "test_generate_with_prefix",
                     "test_prefix_refusals_leave_the_model_unchanged"), PREFIX),
    "test_stream_equals_generate_and_frees_the_cache": STREAM,
    "test_each_declared_arithmetic_matches_its_reference": ARITHMETIC,
    "test_rule_results_unchanged_after_later_calls": RESULTS_UNCHANGED,
    "test_logit_rows_of_each_weight_type": LOGIT_ROWS,
    "test_codec_is_declared_by_probe_and_plugin": CODEC_DECLARED,
    **dict.fromkeys(("test_shared_example", "test_decode_matches_reference",
                     "test_both_containers_decode_alike", "test_out_of_range_codes_are_clamped"),
                    CODEC_REFERENCE),
    **dict.fromkeys(("test_streaming_equals_one_shot", "test_long_stream_equals_one_shot",
                     "test_stream_reset_and_empty_push", "test_windowed_stream"),
                    CODEC_STREAMS),
    **dict.fromkeys(("test_encode_matches_reference", "test_encode_whole_frames_and_short_audio"),
                    CODEC_ENCODE),
    **dict.fromkeys(("test_failed_push_leaves_stream_unchanged", "test_bad_codes",
                     "test_bad_audio"), CODEC_BAD_INPUT),
    "test_close": CODEC_CLOSE,
    # batching and serving tests whose plain asserts belong to their module's rules
    "test_generate_many_equals_generate": "served-requests-equal-generate",
    "test_cancel_leaves_the_others_unchanged": "served-requests-equal-generate",
    "test_requests_share_a_voice_prefix": "served-requests-equal-generate",
    "test_batching_capability_is_backed_by_methods": "batching-capability-backed-by-methods",
    "test_slots_equal_sequences_alone": "slots-equal-sequences-alone",
    "test_slot_snapshots_are_copies": "slot-snapshots-are-copies",
    "test_a_shared_voice_is_held_once": "a-shared-voice-is-held-once",
    "test_slots_advance_by_their_own_rows": "slots-advance-by-their-own-rows",
    "test_slots_join_leave_and_are_reused": "slots-join-leave-and-are-reused",
    "test_slot_results_unchanged_after_later_calls": "slot-results-unchanged-after-later-calls",
    "test_declared_max_batch_sequences_holds": "declared-max-batch-sequences-holds",
    "test_fast_decode_batch_equals_rows_alone": "batched-fast-ar-equals-rows-alone",
    "test_slot_bad_input_leaves_slots_unchanged": "bad-slot-input-changes-nothing",
    "test_slots_beyond_the_memory_limit_are_refused": "slots-beyond-the-limit-are-refused-and-kept",
    "test_slots_start_with_a_shared_prefix": "slots-start-with-a-shared-prefix",
    "test_shared_prefix_unchanged_by_its_slots": "shared-prefix-unchanged-by-its-slots",
    "test_a_released_voice_frees_only_itself": "a-released-voice-frees-only-itself",
}


def rule_of_test(test_name: str) -> str | None:
    """The rule a kit test checks ("test_rule_x_y" checks "x-y"), or None for a test that is
    not the kit's."""
    if test_name in TEST_RULES:
        return TEST_RULES[test_name]
    if test_name.startswith("test_rule_"):
        rule = test_name.removeprefix("test_rule_").replace("_", "-")
        return rule if rule in ALL_RULES else None
    return None


def prefixed(test_name: str, message: str) -> str:
    """A failure message that starts with the rule's id and what it asks (unchanged when it
    already does, or when the test is not the kit's)."""
    rule = rule_of_test(test_name)
    if rule is None or message.startswith("rule '"):
        return message
    return f"rule '{rule}' ({ALL_RULES[rule]}): {message}"
