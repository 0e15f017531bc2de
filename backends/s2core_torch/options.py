"""The backend's options, checked and resolved before any weight is read."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from s2core.plugin import check_option
from s2core.errors import BackendUnavailableError, InvalidInputError

from .plugin import (ARITHMETICS, CACHE_DTYPES, COMPUTE_DTYPES, ENV_DEVICE, ENV_DTYPE,
                     ENV_QUANTIZED, QUANTIZED_MODES, default_quantized_mode, device_kind,
                     triton_installed, valid_device_name)

#: the `quant_kernels` option: how products from stored quantized weights are computed
QUANT_KERNELS = ("triton", "torch")

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Options:
    device: torch.device
    compute_dtype: str          # "f32" | "f16" | "bf16" (on the CPU always "f32", see ops.Matmul)
    kv_cache_dtype: str         # "f16" | "bf16" | "f32"
    single_token_semantic_prefill: bool | None  # None = auto
    quantized: str = "widen"    # "stored" | "widen": quantized GGUF types kept or dequantized
    quant_kernels: str = "torch"  # "triton" | "torch" (quantized.QuantizedProducts)
    arithmetic: str = "f32"     # "f32" | "ggml" (s2.cpp's: ggml_products.py)

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def device_name(self) -> str:
        return str(self.device)


def resolve(device: Any = None, dtype: str | None = None, kv_cache_dtype: str = "f16",
            single_token_semantic_prefill: bool | None = None, quantized: str | None = None,
            quant_kernels: str | None = None, arithmetic: str | None = None) -> Options:
    """Validate the keyword options; None means the environment's choice, then the default."""
    dev = _resolve_device(device)
    kind = dev.type
    dtype = dtype if dtype is not None else (os.environ.get(ENV_DTYPE, "").strip() or "f32")
    arithmetic = "f32" if arithmetic is None else arithmetic
    check_option("arithmetic", arithmetic, ARITHMETICS)
    if arithmetic == "ggml":
        quantized, quant_kernels = _ggml_setup(dtype, quantized, quant_kernels, kind)
    check_option("dtype", dtype, COMPUTE_DTYPES[kind])
    if dtype == "bf16" and torch.cuda.get_device_capability(dev) < (8, 0):
        raise BackendUnavailableError(f"dtype='bf16': {dev} predates bfloat16 support (sm_80)")
    check_option("kv_cache_dtype", kv_cache_dtype, CACHE_DTYPES)
    if not (single_token_semantic_prefill is None or isinstance(single_token_semantic_prefill, bool)):
        raise InvalidInputError(
            "single_token_semantic_prefill", "single_token_semantic_prefill must be None (auto), "
            f"True or False, got {single_token_semantic_prefill!r}")
    quantized = quantized if quantized is not None else (
        os.environ.get(ENV_QUANTIZED, "").strip() or default_quantized_mode(kind, triton_installed()))
    check_option("quantized", quantized, QUANTIZED_MODES)
    return Options(dev, dtype, kv_cache_dtype, single_token_semantic_prefill, quantized,
                   _resolve_kernels(quant_kernels, kind), arithmetic)


def _ggml_setup(dtype: str, quantized: str | None, quant_kernels: str | None,
                kind: str) -> tuple[str, str]:
    """arithmetic="ggml" computes in float32 from the blocks as stored, with Triton's kernels
    (triton_ggml.py): on CUDA, or on the CPU under Triton's interpreter (the tests). Returns
    the `quantized` and `quant_kernels` it takes."""
    if dtype != "f32":
        raise InvalidInputError("arithmetic", f"arithmetic='ggml' computes in float32 (ggml's "
                                f"float steps), not dtype={dtype!r}: use dtype='f32'")
    if quantized not in (None, "stored"):
        raise InvalidInputError("arithmetic", "arithmetic='ggml' multiplies quantized weights "
                                f"from their blocks as stored, not quantized={quantized!r}")
    if quant_kernels not in (None, "triton"):
        raise InvalidInputError("arithmetic", "arithmetic='ggml' takes Triton's kernels, not "
                                f"quant_kernels={quant_kernels!r}")
    if not triton_installed():
        raise BackendUnavailableError("arithmetic='ggml' needs triton's int8 kernels "
                                      "(pip install 's2core[triton]')")
    if kind != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise BackendUnavailableError("arithmetic='ggml' runs on CUDA with torch (Triton int8 "
                                      "dot products); on the CPU torch offers 'f32' only and "
                                      "the NumPy backend offers 'ggml'")
    return "stored", "triton"


def _resolve_kernels(quant_kernels: str | None, kind: str) -> str:
    """None: Triton's on CUDA when it is installed, torch's otherwise. Triton's kernels run on
    CUDA, or on the CPU under its interpreter (TRITON_INTERPRET=1: what the tests use)."""
    if quant_kernels is None:
        return "triton" if kind == "cuda" and triton_installed() else "torch"
    check_option("quant_kernels", quant_kernels, QUANT_KERNELS)
    if quant_kernels == "triton":
        if not triton_installed():
            raise BackendUnavailableError("quant_kernels='triton': triton is not installed "
                                          "(pip install 's2core[triton]')")
        if kind != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise BackendUnavailableError("quant_kernels='triton' runs on CUDA, or on the CPU "
                                          "only under Triton's interpreter (TRITON_INTERPRET=1)")
    return quant_kernels


def _resolve_device(device: Any) -> torch.device:
    if device is None:
        device = os.environ.get(ENV_DEVICE, "").strip() or (
            "cuda" if torch.cuda.is_available() else "cpu")
    name = str(device)
    if not valid_device_name(name):
        raise InvalidInputError("device", f"device={device!r} is not 'cpu', 'cuda' or 'cuda:N'")
    if device_kind(name) == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise BackendUnavailableError(
            f"device={name!r}: CUDA is not available to torch {torch.__version__} ({build}, "
            "or no NVIDIA GPU/driver); use device='cpu'")
    index = torch.cuda.current_device() if name == "cuda" else int(name.split(":")[1])
    count = torch.cuda.device_count()
    if index >= count:
        raise BackendUnavailableError(
            f"device={name!r}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)
