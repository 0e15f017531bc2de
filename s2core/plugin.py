"""Everything a backend plugin needs from s2core, in one module: the face third parties import.

    from s2core.plugin import Backend, Capabilities, BackendSpec, Option, Probe, hookimpl

Backends and plugins (the built-in NumPy and torch ones included) import the core only from
here and from `s2core.errors`, plus `s2core.kit` in their tests; everything else in s2core may
move between releases. docs/contract.md describes each name.

- The Slow-AR contract: `Backend`, `Capabilities`, `EvalBatch`, `check_option`, and
  `ARITHMETICS` (the values of `Capabilities.arithmetics`); `LogitRows` (a batch's
  `logit_rows`) with `shared_logit_rows` / `pick_logit_rows` for a call of several batches.
- Registration: `hookimpl`, `BackendSpec`, `Probe`, `Option`, and `ENTRY_POINT_GROUP` (the
  entry-point group a plugin's package declares).
- The model file: `ModelFile`, `Hparams`, `FastHparams`, `StackShape`, the block record
  `BlockWeights` and the layout helpers `load_block` / `load_fast_ar` that fill it.
- Quantized blocks: `block_shape`, `QUANTIZED_TYPES`, `non_finite_scale_blocks`,
  `NonFiniteScalesWarning`.
- The codec contract: `CodecBackend`, `CodecCapabilities`, `CodecFile`, its layout records
  (`Conv`, `ConvTranspose`, `ConvNeXt`, `ResidualUnit`, `Transformer`) and the streaming
  helpers `DecodeState`, `HistoryPass`.
- The host: `available_host_memory_bytes`, `host_memory_bytes`.
- The errors a backend raises: `InvalidInputError`, `BackendUnavailableError`,
  `CacheAllocationError`, `S2CoreError`; `BackendError` and `BackendOutOfMemoryError` are what
  the core makes of any other exception a backend raises (docs/contract.md).
"""

from s2core.codec.backend import CodecBackend, CodecCapabilities
from s2core.codec.file import CodecFile
from s2core.codec.layout import Conv, ConvNeXt, ConvTranspose, ResidualUnit, Transformer
from s2core.codec.streaming import DecodeState, HistoryPass
from s2core.contract.backend import ARITHMETICS, Backend, Capabilities, check_option
from s2core.contract.host import available_host_memory_bytes, host_memory_bytes
from s2core.contract.inputs import EvalBatch, LogitRows, pick_logit_rows, shared_logit_rows
from s2core.contract.plugin_spec import ENTRY_POINT_GROUP, BackendSpec, Option, Probe, hookimpl
from s2core.errors import (BackendError, BackendOutOfMemoryError, BackendUnavailableError,
                           CacheAllocationError, InvalidInputError, S2CoreError)
from s2core.gguf.blocks import (QUANTIZED_TYPES, NonFiniteScalesWarning, block_shape,
                                non_finite_scale_blocks)
from s2core.modelfile.file import ModelFile
from s2core.modelfile.hparams import FastHparams, Hparams, StackShape
from s2core.modelfile.layout import BlockWeights, load_block, load_fast_ar

__all__ = [
    "Backend", "Capabilities", "EvalBatch", "check_option", "ARITHMETICS", "LogitRows",
    "shared_logit_rows", "pick_logit_rows",
    "hookimpl", "BackendSpec", "Probe", "Option", "ENTRY_POINT_GROUP",
    "ModelFile", "Hparams", "FastHparams", "StackShape", "BlockWeights", "load_block",
    "load_fast_ar",
    "block_shape", "QUANTIZED_TYPES", "non_finite_scale_blocks", "NonFiniteScalesWarning",
    "CodecBackend", "CodecCapabilities", "CodecFile", "Conv", "ConvTranspose", "ConvNeXt",
    "ResidualUnit", "Transformer", "DecodeState", "HistoryPass",
    "available_host_memory_bytes", "host_memory_bytes",
    "InvalidInputError", "BackendUnavailableError", "CacheAllocationError", "S2CoreError",
    "BackendError", "BackendOutOfMemoryError",
]
