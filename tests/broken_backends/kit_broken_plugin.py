"""Registers the broken backends (kit_broken_backends.py) under $S2CORE_PLUGINS."""

import dataclasses

from s2core.contract.plugin_spec import BackendSpec, Option, Probe, hookimpl
from s2core_example.plugin import CAPABILITIES
from s2core_numpy.plugin import OPTIONS as NUMPY_OPTIONS
from s2core_numpy.plugin import numpy_capabilities

from kit_broken_backends import F16_DECLARED, HALF_DECLARED
from kit_broken_batching import BATCH_DECLARED, SHARES_DECLARED

F32_ONLY = (Option("kv_cache_dtype", choices=("f32",), default="f32"),)


def spec(name, cls, caps=CAPABILITIES, options=F32_ONLY, module="kit_broken_backends"):
    return BackendSpec(name=f"broken_{name}", backend_class=f"{module}:{cls}",
                       probe=lambda: Probe(True, "broken on purpose", caps),
                       priority=-100, options=options)


def batch_spec(name, cls, module="kit_broken_batching"):
    """A broken variation of the NumPy backend (kit_broken_batching.py)."""
    return spec(name, cls, numpy_capabilities(), NUMPY_OPTIONS, module)


def codec_spec(name, codec_class, encode=True):
    """NumPy's backend with a codec of kit_broken_codec.py."""
    caps = numpy_capabilities()
    caps = dataclasses.replace(caps, codec=dataclasses.replace(caps.codec, encode=encode))
    return BackendSpec(name=f"broken_{name}", backend_class="s2core_numpy.backend:NumpyBackend",
                       codec_class=f"kit_broken_codec:{codec_class}",
                       probe=lambda: Probe(True, "broken on purpose", caps), priority=-100,
                       options=NUMPY_OPTIONS)


def declared_spec(name, cls, numpy=False):
    """A broken backend of issue 22 (kit_broken_declared.py), NumPy's or the example's."""
    if numpy:
        return batch_spec(name, cls, "kit_broken_declared")
    return spec(name, cls, module="kit_broken_declared")


@hookimpl
def s2core_backends():
    return [
        spec("alias_results", "AliasResults"),
        spec("alias_fast", "AliasFastLogits"),
        spec("view_snapshots", "ViewSnapshots"),
        spec("numpy_old_snapshots", "NumpyOldSnapshots", numpy_capabilities(), NUMPY_OPTIONS),
        spec("fast_slow_rope", "FastSlowRope"),
        spec("fast_slow_eps", "FastSlowEps"),
        spec("fast_slow_heads", "FastSlowHeads"),
        spec("f16_declared_f32_held", "F16DeclaredF32Held", F16_DECLARED,
             (Option("kv_cache_dtype", choices=("f16",), default="f16"),)),
        spec("f32_declared_f16_held", "F32DeclaredF16Held"),
        spec("half_declared", "HalfDeclaredF32Computed", HALF_DECLARED),
        spec("f32_declared_half_results", "F32DeclaredHalfResults"),
        # declares an option the class does not take
        spec("option_not_taken", "ExampleBackend",
             options=F32_ONLY + (Option("threads", choices=(1, 2), default=1),)),
        # the class takes a keyword the spec does not declare
        spec("option_undeclared", "TakesUndeclaredOption"),
        # declares f16 too, and the class takes it without acting on it
        spec("option_ignored", "IgnoresKvCacheDtype",
             options=(Option("kv_cache_dtype", choices=("f32", "f16"), default="f32"),)),
        # a schema that accepts anything at all
        spec("option_accepts_anything", "IgnoresKvCacheDtype",
             options=(Option("kv_cache_dtype", accepts=lambda value: True, values="anything",
                             default="f32"),)),
        spec("shared_call_state", "SharedCallState"),
        spec("keeps_weights_on_close", "KeepsWeightsOnClose"),
        spec("loses_cache_on_failed_init", "LosesCacheOnFailedInit"),
        # several sequences per call (kit_broken_batching.py)
        spec("batch_without_methods", "DeclaresBatchingWithoutMethods", BATCH_DECLARED,
             module="kit_broken_batching"),
        spec("sharing_without_methods", "DeclaresSharingWithoutMethods", SHARES_DECLARED,
             module="kit_broken_batching"),
        batch_spec("batch_results_in_slot_order", "ResultsInSlotOrder"),
        batch_spec("batch_counts_the_calls_rows", "CountsTheCallsRows"),
        batch_spec("batch_keeps_positions_on_reuse", "KeepsPositionsOnReuse"),
        batch_spec("batch_keeps_prefix_after_reset", "KeepsPrefixAfterReset"),
        batch_spec("batch_alias_results", "AliasSlotResults"),
        batch_spec("batch_alias_fast", "AliasBatchedFastLogits"),
        batch_spec("batch_four_slots_at_most", "FourSlotsAtMost"),
        batch_spec("batch_fast_first_row_codes", "FastBatchFirstRowCodes"),
        batch_spec("batch_writes_shared_prefix", "WritesIntoSharedPrefix"),
        batch_spec("batch_reads_own_rows_only", "ReadsOwnRowsOnly"),
        batch_spec("batch_loses_slots_on_failed_init", "LosesSlotsOnFailedInit"),
        batch_spec("batch_removes_another_voice", "RemovesAnotherVoice"),
        batch_spec("batch_keeps_removed_voice", "KeepsRemovedVoice"),
        # declared capabilities, foreign exceptions, isolation (kit_broken_declared.py)
        declared_spec("cache_storage_understated", "CacheStorageUnderstated", numpy=True),
        declared_spec("claims_mapped_but_copies", "ClaimsMappedButCopies", numpy=True),
        declared_spec("batch_shares_prefix_but_copies", "SharesPrefixButCopies", numpy=True),
        declared_spec("batch_slot_snapshot_views", "SlotSnapshotViews", numpy=True),
        declared_spec("batch_drifts", "BatchedDrift", numpy=True),
        declared_spec("loaded_cache_type_f12", "LoadedCacheTypeF12"),
        declared_spec("loaded_negative_batch", "LoadedNegativeBatch"),
        declared_spec("key_error_in_allocate", "KeyErrorInAllocate"),
        declared_spec("index_error_in_eval", "IndexErrorInEval"),
        declared_spec("global_scratch_hidden", "GlobalScratchHidden"),
        # the logit-rows rule (kit_broken_logit_rows.py)
        batch_spec("rows_declared_all_returned", "RowsDeclaredAllReturned",
                   "kit_broken_logit_rows"),
        batch_spec("rows_shifted", "RowsShifted", "kit_broken_logit_rows"),
        batch_spec("slots_take_the_first_rows", "SlotsTakeTheFirstRows", "kit_broken_logit_rows"),
        # codecs (kit_broken_codec.py)
        codec_spec("codec_mutates_stream_state", "MutatesStreamState"),
        codec_spec("codec_without_encoder", "NoEncoder", encode=False),
    ]
