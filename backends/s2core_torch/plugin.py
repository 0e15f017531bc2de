"""Registers the PyTorch backend. Cheap to import and to probe: torch itself is never imported
here (that costs seconds); its presence and CUDA build are read from the file system.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from s2core.plugin import ARITHMETICS, Capabilities
from s2core.plugin import CodecCapabilities
from s2core.plugin import BackendSpec, Option, Probe, hookimpl

ENV_DEVICE = "S2CORE_TORCH_DEVICE"
ENV_DTYPE = "S2CORE_TORCH_DTYPE"
ENV_QUANTIZED = "S2CORE_TORCH_QUANTIZED"

CACHE_DTYPES = ("f16", "bf16", "f32")
#: compute dtypes per device kind; the CPU computes in f32 (half weights aside, see below)
COMPUTE_DTYPES = {"cpu": ("f32",), "cuda": ("f32", "f16", "bf16")}
#: F32, F16 and BF16 tensors are used as stored; quantized types are widened on load
NATIVE_WEIGHT_TYPES = frozenset({"f32", "f16", "bf16"})
#: GGUF's quantized types, kept as stored with quantized="stored" (computed from the blocks:
#: quantized.py); every tensor keeps its own type, so mixed files (q4_k_m) are covered
QUANTIZED_WEIGHT_TYPES = frozenset({"q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
                                    "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"})
#: the `quantized` option: "stored" keeps them, "widen" dequantizes them on load
QUANTIZED_MODES = ("stored", "widen")
#: quantized weights become f16 on the CPU (2 bytes/param and torch's fast f16 GEMV)
CPU_WIDENED_DTYPE = "f16"

CUDA_PRIORITY = 300
#: Below NumPy's 100 but within selection.PEER_BAND of it, as measured (benchmarks/results):
#: where both map a file in place (f32) NumPy steps faster (~1.0x its floor, torch ~1.8x), so
#: the tie goes to NumPy; selection prefers torch where it holds fewer bytes or copies fewer
#: (f16: mapped in place, against NumPy's packed copy), and there torch was the faster on this
#: project's Intel Xeon (docs/backend-choice.md; NumPy was on an AMD EPYC).
CPU_PRIORITY = 90

#: codec rank (s2core.runtime.codec_selection): on the CPU just below NumPy's codec, as measured with
#: two threads on this project's shared 2-core machine (s2core bench --codec: NumPy's im2col +
#: sgemm reached 41-48% of the sgemm measured beside it, torch 28-38%; torch led only
#: single-threaded, 61% to 52%); on CUDA the Slow-AR's CUDA priority
CODEC_CPU_PRIORITY = 95

_DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:\d+)?)$")


def device_kind(device: str) -> str:
    """"cpu" or "cuda" for a device string such as "cuda:1"."""
    return device.split(":", 1)[0]


def valid_device_name(device: str) -> bool:
    return bool(_DEVICE_PATTERN.match(device))


def default_quantized_mode(device_kind_name: str, triton_installed: bool) -> str:
    """quantized=None: "stored" on CUDA with Triton (fused dequantizing kernels: a q4_k_m file
    takes its own size and a step reads 4-6 bits a weight), else "widen": on the CPU the NumPy
    backend is the faster choice for quantized files anyway, and torch's f16 GEMV over widened
    weights beats dequantizing every weight per product; on CUDA without Triton, likewise
    (quantized="stored" still works there, slowly, when memory is what counts)."""
    return "stored" if device_kind_name == "cuda" and triton_installed else "widen"


def offered_arithmetics(device_kind_name: str, triton_here: bool, compute_dtype: str,
                        quantized: str) -> tuple[str, ...]:
    """"ggml" where its kernels run: CUDA with Triton (int8 dot products, triton_ggml.py),
    float32 compute, quantized weights kept as stored. "f32" is the default there: ggml's
    arithmetic on CUDA has not been measured faster yet (benchmarks/cuda_check.py times both).

    On the CPU torch offers "f32" only: its int8 path would be slower than its float one, and
    the NumPy backend offers "ggml" with integer kernels of its own. Measured here (2 loaded
    vCPUs, a 9728x2560 matrix, one activation row): torch._int_mm 41 ms against the f16 GEMV's
    35 ms, and _int_mm returns one sum per row where ggml needs one per block of 32 or 256
    (a product per block, or a float pass over the codes, on top)."""
    if device_kind_name == "cuda" and triton_here and compute_dtype == "f32" \
            and quantized == "stored":
        return ARITHMETICS
    return ("f32",)


def triton_installed() -> bool:
    """Found on the path (not imported: that costs a second)."""
    return importlib.util.find_spec("triton") is not None


#: KV slots one call evaluates (slots.py); each slot has its own cache, allocated by init_slots
MAX_BATCH_SEQUENCES = 16


def torch_capabilities(device: str, compute_dtype: str, kv_cache_dtype: str = "f16",
                       n_accelerated_layers: int | None = None,
                       single_token_semantic_prefill: bool = False,
                       kv_cache_storage_dtype: str | None = None,
                       quantized: str = "widen", arithmetic: str = "f32") -> Capabilities:
    """What the backend is on `device`; n_accelerated_layers None means "all layers".

    kv_cache_storage_dtype None: the default rule. On the CPU (float32 attention) an f16/bf16
    cache is held in float32 with rounded values (kv_cache.storage_dtype); on CUDA as is.
    quantized "stored": the quantized types are native too, held byte for byte (on the CPU as
    the memory map itself). arithmetic: the loaded one; "ggml" is offered where
    offered_arithmetics says, and on the CPU by a backend loaded with it under Triton's
    interpreter (the tests)."""
    on_cuda = device_kind(device) == "cuda"
    native = NATIVE_WEIGHT_TYPES | (QUANTIZED_WEIGHT_TYPES if quantized == "stored" else frozenset())
    if kv_cache_storage_dtype is None and not on_cuda and kv_cache_dtype != "f32":
        kv_cache_storage_dtype = "f32"
    if kv_cache_storage_dtype == kv_cache_dtype:
        kv_cache_storage_dtype = None
    return Capabilities(
        device=device, accelerator=on_cuda, n_accelerated_layers=n_accelerated_layers,
        requires_single_token_semantic_prefill=single_token_semantic_prefill,
        kv_cache_dtype=kv_cache_dtype, kv_cache_storage_dtype=kv_cache_storage_dtype,
        supported_kv_cache_dtypes=CACHE_DTYPES,
        compute_dtype=compute_dtype, native_weight_types=native,
        # on the CPU the stored types are torch views of the memory map; CUDA copies them
        mapped_weight_types=frozenset() if on_cuda else native,
        widened_weight_dtype=compute_dtype if on_cuda else CPU_WIDENED_DTYPE,
        writes_kv_cache=True, max_batch_sequences=MAX_BATCH_SEQUENCES, shares_kv_prefix=True,
        codec=torch_codec_capabilities(device),
        arithmetics=ARITHMETICS if arithmetic == "ggml" else offered_arithmetics(
            device_kind(device), triton_installed(), compute_dtype, quantized),
        arithmetic=arithmetic)


def torch_codec_capabilities(device: str) -> CodecCapabilities:
    """The codec (codec.py): float32 conv1d / conv_transpose1d and SDPA, exact streaming."""
    on_cuda = device_kind(device) == "cuda"
    return CodecCapabilities(device=device, accelerator=on_cuda, compute_dtype="f32",
                             streaming=True, encode=True, native_weight_types=frozenset({"f32"}),
                             priority=CUDA_PRIORITY if on_cuda else CODEC_CPU_PRIORITY)


def nvidia_driver_present() -> bool:
    """An NVIDIA kernel driver is loaded (no CUDA call, no torch import)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False  # the GPUs are hidden from this process
    return any(os.path.exists(p) for p in ("/proc/driver/nvidia/version", "/dev/nvidiactl"))


def torch_is_cuda_build(torch_dir: Path) -> bool:
    """The installed torch ships its CUDA library (a CPU wheel does not)."""
    lib = torch_dir / "lib"
    return any(lib.glob("*torch_cuda*")) if lib.is_dir() else False


def probe() -> Probe:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return Probe(available=False, reason="torch is not installed (pip install 's2core[torch]')",
                     capabilities=torch_capabilities("cpu", "f16"), priority=CPU_PRIORITY)
    cuda_here = nvidia_driver_present() and torch_is_cuda_build(Path(spec.origin).parent)
    device = os.environ.get(ENV_DEVICE, "").strip() or ("cuda" if cuda_here else "cpu")
    kind = device_kind(device)
    if not valid_device_name(device):
        return _unavailable(f"{ENV_DEVICE}={device!r} is not cpu, cuda or cuda:N")
    if kind == "cuda" and not cuda_here:
        return _unavailable(f"{ENV_DEVICE}={device!r} but no NVIDIA driver and CUDA build of "
                            "torch were found")
    dtype = os.environ.get(ENV_DTYPE, "").strip() or "f32"
    if dtype not in COMPUTE_DTYPES[kind]:
        return _unavailable(f"{ENV_DTYPE}={dtype!r} is not offered on {kind} "
                            f"(choices: {COMPUTE_DTYPES[kind]})")
    quantized = (os.environ.get(ENV_QUANTIZED, "").strip()
                 or default_quantized_mode(kind, triton_installed()))
    if quantized not in QUANTIZED_MODES:
        return _unavailable(f"{ENV_QUANTIZED}={quantized!r} is not one of {QUANTIZED_MODES}")
    if kind == "cuda":
        return Probe(available=True, reason=f"torch with CUDA; computes in {dtype} on {device}; "
                     f"quantized weights {'kept as stored' if quantized == 'stored' else 'widened'}",
                     capabilities=torch_capabilities(device, dtype, quantized=quantized),
                     priority=CUDA_PRIORITY)
    # On the CPU, f16/bf16 weights take activations of their own type in matrix-vector products
    # (torch's fast half GEMV, as ggml does): "f16" for the f16 and quantized files S2 Pro ships
    # as. The loaded backend reports the exact value for its file (f32 for an f32 file).
    return Probe(available=True, reason="torch on the CPU (no CUDA device found)",
                 capabilities=torch_capabilities("cpu", "f16", n_accelerated_layers=0,
                                                 quantized=quantized),
                 priority=CPU_PRIORITY)


def _unavailable(reason: str) -> Probe:
    return Probe(available=False, reason=reason, capabilities=torch_capabilities("cpu", "f16"),
                 priority=CPU_PRIORITY)


def _device_accepted(value: object) -> bool:
    """None, "cpu", "cuda", "cuda:N", or a torch.device (recognized without importing torch)."""
    if value is None:
        return True
    if type(value).__module__ == "torch" and type(value).__name__ == "device":
        value = str(value)
    return isinstance(value, str) and valid_device_name(value)


#: the keyword options TorchBackend takes, checked by the core before torch is imported; the
#: backend still refuses what this machine cannot do (f16 compute on the CPU, an absent GPU)
OPTIONS = (
    Option("device", accepts=_device_accepted, default=None,
           values="None, 'cpu', 'cuda', 'cuda:N' or a torch.device",
           doc=f"None: ${ENV_DEVICE}, else cuda when present, else cpu"),
    Option("dtype", choices=(None, "f32", "f16", "bf16"), default=None,
           doc=f"compute type; None: ${ENV_DTYPE}, else f32; f16 and bf16 on CUDA only"),
    Option("kv_cache_dtype", choices=CACHE_DTYPES, default="f16",
           doc="type of the cached K/V values"),
    Option("single_token_semantic_prefill", choices=(None, True, False), default=None,
           doc="chunk prompts one semantic position at a time (s2.cpp's CUDA guard); "
               "None: off, every table is dequantized on load"),
    Option("quantized", choices=(None,) + QUANTIZED_MODES, default=None,
           doc=f"quantized GGUF types kept as stored or widened on load; None: ${ENV_QUANTIZED}, "
               "else stored on CUDA with Triton, widen elsewhere"),
    Option("quant_kernels", choices=(None, "triton", "torch"), default=None,
           doc="products from stored quantized weights: Triton kernels (CUDA, or the CPU under "
               "TRITON_INTERPRET=1) or a per-product dequantize; None: triton where it runs"),
    Option("arithmetic", choices=(None,) + ARITHMETICS, default=None,
           doc="products with non-F32 weights: \"ggml\" rounds the activation as s2.cpp does "
               "(8-bit blocks, integer dots in Triton; CUDA, dtype f32, quantized stored), "
               "\"f32\" feeds it unrounded (None: \"f32\")"),
)


@hookimpl
def s2core_backends() -> list[BackendSpec]:
    return [BackendSpec(name="torch", backend_class="s2core_torch.backend:TorchBackend",
                        probe=probe, priority=CPU_PRIORITY, options=OPTIONS,
                        codec_class="s2core_torch.codec:TorchCodec",
                        description="PyTorch on CUDA (f32/f16/bf16 compute) or the CPU; "
                                    "F16/BF16 weights kept as stored, quantized ones too on "
                                    "CUDA (Triton dequantizing kernels)")]
