"""Registers the MLX backend with s2core (entry point group `s2core.backends`).

Cheap to import and to probe: nothing here imports mlx, not even its package. The probe only
asks whether the `mlx.core` extension is on the path (found, not loaded), which platform this
is, and which of MLX's backend libraries are installed (package metadata).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import platform

from s2core.plugin import Capabilities
from s2core.plugin import CodecCapabilities
from s2core.plugin import BackendSpec, Option, Probe, hookimpl

CACHE_DTYPES = ("f16", "bf16", "f32")
#: what widened tensors become (Q2_K/Q3_K/Q6_K with sub_block_quants="widen", and tensors with
#: non-finite scales): f32 is exact; f16 halves their memory (rounds each weight once)
WIDENED_DTYPES = ("f32", "f16")
#: Q2_K/Q3_K/Q6_K: "split" keeps them exactly in MLX's affine format, each 16-value sub-block
#: padded to a group of 32 (sub_blocks.py: 14 / 8 / 8 bits a weight); "widen" dequantizes them
SUB_BLOCK_MODES = ("split", "widen")
#: scales and biases of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: f16 (exact, checked per tensor; biases
#: that are k * scale rebuilt per product: the file's own size) or f32 (2 bits a weight, no
#: per-product widening). The K-quants' are always f32.
SCALE_DTYPES = ("f16", "f32")
#: GGUF types kept in memory as stored: floats as MLX arrays of that type, quantized types in
#: MLX's affine format (converted exactly, see gguf_quant), and with sub_block_quants="split"
#: (the default) Q2_K, Q3_K, Q6_K too (SPLIT_TYPES). Held sizes: floats and (with
#: quant_scale_dtype="f16", the default) Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 exactly the file's bytes;
#: Q4_K 1.33x and Q5_K 1.27x (float32 scales and biases); Q6_K 2.13x, Q3_K 2.33x, Q2_K 3.05x
#: (split); with quant_scale_dtype="f32" the legacy quants take 2 bits a weight more (Q8_0
#: 1.18x). Capabilities.native_weight_overhead declares each factor (QUANT_OVERHEAD).
NATIVE_WEIGHT_TYPES = frozenset({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
                                 "q4_k", "q5_k"})
SPLIT_TYPES = frozenset({"q6_k", "q3_k", "q2_k"})
#: held bytes per file byte of the split types (sub_blocks.OVERHEAD, without importing numpy's
#: side of the plugin here): codes twice plus float32 scales (and Q2_K's biases) per 16
SPLIT_OVERHEAD = (("q6_k", 14 / 6.5625), ("q3_k", 8 / 3.4375), ("q2_k", 8 / 2.625))

#: sequences one eval_slots call evaluates (as NumPy and torch)
MAX_BATCH_SEQUENCES = 16

#: Apple GPU: above every other backend
METAL_PRIORITY = 400
#: a CPU build (Linux): below NumPy (100); MLX's Linux wheel multiplies with the reference BLAS
CPU_PRIORITY = 10

INSTALL_HINT = "pip install mlx (macOS, Apple silicon) or pip install 'mlx[cpu]' (Linux)"


def is_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


#: Held bytes per file byte of the quantized types MLX keeps, by quant_scale_dtype. Per group
#: of 32 weights MLX holds the codes plus its scale/bias; GGUF holds codes plus its own scales:
#: with float16 scales the legacy types match the file exactly (a fixed bias is rebuilt per
#: product), the K-quants need float32 d*sc and dmin*m (Q4_K 192 bits vs 144, Q5_K 224 vs 176);
#: with float32 scales everything carries 64 bits of scale and bias per group.
QUANT_OVERHEAD = {
    "f16": (("q4_k", 192 / 144), ("q5_k", 224 / 176)),
    "f32": (("q8_0", 320 / 272), ("q4_0", 192 / 144), ("q4_1", 192 / 160), ("q5_0", 224 / 176),
            ("q5_1", 224 / 192), ("q4_k", 192 / 144), ("q5_k", 224 / 176)),
}


def mlx_codec_capabilities(metal: bool) -> CodecCapabilities:
    """The codec (codec.py): float32 mx.conv1d / conv_transpose1d and mx.fast kernels, exact
    streaming; ranked like the backend itself (Metal first, the Linux CPU build last)."""
    return CodecCapabilities(device="metal" if metal else "cpu", accelerator=metal,
                             compute_dtype="f32", streaming=True, encode=True,
                             native_weight_types=frozenset({"f32"}),
                             priority=METAL_PRIORITY if metal else CPU_PRIORITY)


def mlx_capabilities(metal: bool, kv_cache_dtype: str = "f16", widened_weight_dtype: str = "f32",
                     quant_scale_dtype: str = "f16", sub_block_quants: str = "split"
                     ) -> Capabilities:
    split = sub_block_quants == "split"
    return Capabilities(
        device="metal" if metal else "cpu", accelerator=metal,
        n_accelerated_layers=None if metal else 0,
        requires_single_token_semantic_prefill=False, kv_cache_dtype=kv_cache_dtype,
        supported_kv_cache_dtypes=CACHE_DTYPES, compute_dtype="f32",
        native_weight_types=NATIVE_WEIGHT_TYPES | (SPLIT_TYPES if split else frozenset()),
        widened_weight_dtype=widened_weight_dtype,
        native_weight_overhead=QUANT_OVERHEAD[quant_scale_dtype] + (SPLIT_OVERHEAD if split else ()),
        writes_kv_cache=True, max_batch_sequences=MAX_BATCH_SEQUENCES, shares_kv_prefix=True,
        codec=mlx_codec_capabilities(metal))


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _mlx_core_installed() -> bool:
    """Whether the mlx.core extension exists, found without importing even the `mlx` package
    (find_spec("mlx.core") would import it)."""
    try:
        top = importlib.util.find_spec("mlx")
    except (ImportError, ValueError):
        return False
    if top is None or not top.submodule_search_locations:
        return False
    return importlib.machinery.PathFinder.find_spec(
        "core", list(top.submodule_search_locations)) is not None


def probe() -> Probe:
    if not _mlx_core_installed():
        return Probe(available=False, reason=f"mlx is not installed ({INSTALL_HINT})",
                     capabilities=mlx_capabilities(metal=False))
    if is_apple_silicon():
        return Probe(available=True, reason="MLX on the Apple GPU (Metal)",
                     capabilities=mlx_capabilities(metal=True), priority=METAL_PRIORITY)
    # On Linux the mlx wheel holds no kernels of its own: mlx[cpu] (or mlx[cuda]) adds them.
    if platform.system() == "Linux" and not (
            _installed("mlx-cpu") or any(_installed(f"mlx-cuda{v}") for v in ("", "-12", "-13"))):
        return Probe(available=False, reason="mlx is installed without its CPU library "
                     "(pip install 'mlx[cpu]')", capabilities=mlx_capabilities(metal=False))
    return Probe(available=True, reason=(
        f"MLX CPU build on {platform.system()}: it multiplies with the reference BLAS, so it is "
        "a correctness target, not a speed one (ranked below numpy)"),
        capabilities=mlx_capabilities(metal=False), priority=CPU_PRIORITY)


#: the keyword options MlxBackend takes, checked by the core before mlx is imported
OPTIONS = (
    Option("kv_cache_dtype", choices=CACHE_DTYPES, default="f16",
           doc="type of the cached K/V values"),
    Option("widened_weight_dtype", choices=WIDENED_DTYPES, default="f32",
           doc="what widened tensors become (f32 exact, f16 half the memory)"),
    Option("quant_scale_dtype", choices=SCALE_DTYPES, default="f16",
           doc="scales and biases of the legacy quants kept quantized (f16: the file's size)"),
    Option("sub_block_quants", choices=SUB_BLOCK_MODES, default="split",
           doc="Q2_K, Q3_K, Q6_K: 'split' keeps them exactly (16-value sub-blocks as groups of "
               "32), 'widen' dequantizes them to widened_weight_dtype"),
)


@hookimpl
def s2core_backends() -> list[BackendSpec]:
    return [BackendSpec(
        name="mlx", backend_class="s2core_mlx.backend:MlxBackend", probe=probe,
        priority=CPU_PRIORITY, options=OPTIONS,
        codec_class="s2core_mlx.codec:MlxCodec",
        description="MLX (Apple GPU via Metal, or CPU): float32 compute, fused RMSNorm/RoPE/"
                    "attention kernels, GGUF quants kept quantized where MLX's format fits "
                    "(legacy quants at the file's size; Q4_K/Q5_K at 1.3x), incremental "
                    "Fast-AR, up to 16 sequences per call with shared voice prefixes")]
