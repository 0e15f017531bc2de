"""Registers the NumPy backend. Cheap to import: the backend module loads only when chosen."""

from __future__ import annotations

import importlib.util

import numpy as np

from s2core.plugin import Capabilities
from s2core.plugin import CodecCapabilities
from s2core.plugin import BackendSpec, Option, Probe, hookimpl

CACHE_DTYPES = ("f16", "f32")
#: the NumPy type each cache type is held in (an F16 cache in float16: half float32's bytes)
CACHE_NUMPY_DTYPES = {"f16": np.float16, "f32": np.float32}
#: the CPU reference: always available; other CPU backends rank by the benchmarks
PRIORITY = 100
#: a Q8_0 block (34 bytes: float16 scale + 32 codes) as the numba kernels hold it: the scale
#: widened to float32 (the kernels' loops vectorize over float32 scales; numba has no float16)
Q8_0_HELD_BYTES = 36


def numba_available() -> bool:
    """numba (the optional `fast` extra) is installed. Looked up, not imported: importing
    numba takes ~0.3 s and the probe must stay cheap."""
    return importlib.util.find_spec("numba") is not None


#: sequences per eval_slots call (slots.py): past 8 rows the few-row kernels stop gaining
#: (bench --case batch); more sequences are served in turns by the core's scheduler
MAX_BATCH_SEQUENCES = 16

#: the block-quantized types the numba kernels compute from as stored (quants.py): the file's
#: blocks byte for byte, rearranged into tiles
NUMBA_BLOCK_TYPES = frozenset({"q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_0", "q4_1", "q5_0",
                               "q5_1"})
#: the types the numba kernels compute from as stored (f16.py, q8_0.py, quants.py)
NUMBA_TYPES = frozenset({"f16", "q8_0"}) | NUMBA_BLOCK_TYPES


#: codec rank (s2core.runtime.codec_selection): above torch's CPU codec, whose measured share of the
#: sgemm peak was lower with two threads here (see s2core_torch.plugin.CODEC_CPU_PRIORITY)
CODEC_PRIORITY = 100


def numpy_codec_capabilities() -> CodecCapabilities:
    """The codec (codec.py): float32 from widened weights, exact streaming, encoder."""
    return CodecCapabilities(device="cpu", accelerator=False, compute_dtype="f32", streaming=True,
                             encode=True, native_weight_types=frozenset({"f32"}),
                             priority=CODEC_PRIORITY)


#: CPU features (LLVM's names) the VNNI integer kernels need (simd.isa), and AMX's besides
VNNI_FEATURES = frozenset({"avx512f", "avx512bw", "avx512vnni"})
#: the AVX2 integer kernels' features (simd.isa)
AVX2_FEATURES = frozenset({"avx2", "f16c"})
AMX_FEATURES = frozenset({"amx-int8", "amx-tile"})
#: set (to anything) to keep the NumPy backend off the AMX tile units
NO_AMX_VARIABLE = "S2CORE_NO_AMX"
#: x86-64 Linux's arch_prctl: its syscall number, the codes that read the features the kernel
#: supports and that ask for one, and AMX's tile data among them (XFEATURE_XTILEDATA)
SYS_ARCH_PRCTL, ARCH_GET_XCOMP_SUPP, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = \
    158, 0x1021, 0x1023, 18


def _target_flags() -> set[str] | None:
    """The CPU features numba compiles for, in LLVM's names ("avx512vnni", "amx-int8"), read
    without importing numba: NUMBA_CPU_FEATURES, else /proc/cpuinfo's flags; None where
    neither tells (not Linux)."""
    import os
    features = os.environ.get("NUMBA_CPU_FEATURES")
    if features is None and os.environ.get("NUMBA_CPU_NAME", "").lower() == "generic":
        features = ""  # numba's generic target: no features at all
    if features is not None:
        return {f[1:] for f in features.split(",") if f.startswith("+")}
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:  # not Linux: not known, so not promised
        return None
    names = {"avx512_vnni": "avx512vnni", "amx_int8": "amx-int8", "amx_tile": "amx-tile"}
    return {names.get(flag, flag) for flag in flags.split(":")[-1].split()}


def integer_kernels_expected() -> bool:
    """Whether numba's integer kernels (int_dots.py) will run here: numba installed and the CPU
    numba compiles for has AVX2 or AVX-512 VNNI (simd.isa() says it at load; this reads the
    same facts without importing numba)."""
    on = _target_flags() if numba_available() else None
    return bool(on) and (AVX2_FEATURES <= on or VNNI_FEATURES <= on)


def amx_expected() -> bool:
    """Whether the AMX kernels (amx.py) will take products of many rows here: the VNNI
    kernels run, the CPU numba compiles for has amx-int8 and amx-tile, Linux supports the
    tile state, and S2CORE_NO_AMX is not set. amx.unavailable_reason() decides at load (and
    asks Linux for the state); this reads the same facts without numba and without asking."""
    import ctypes
    import os
    on = _target_flags() if numba_available() else None
    if os.environ.get(NO_AMX_VARIABLE) or not on or not VNNI_FEATURES | AMX_FEATURES <= on:
        return False
    supported = ctypes.c_uint64(0)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_SUPP, ctypes.byref(supported)) == 0 \
        and bool(supported.value >> XFEATURE_XTILEDATA & 1)


def default_arithmetic(f16_share: float = 0.0) -> str:
    """The arithmetic a load uses when none is named (README "Arithmetic"): "ggml", s2.cpp's
    numbers, where it is also the faster: numba's integer kernels run on this CPU and F16
    matrices hold at most half of the file's matrix bytes (`f16_share`). Else "f32": F16
    products in ggml's order of float sums (ggml_ops.py) stream slower than the tiled kernels
    (served, an f16 file gave 1.16-1.45x the frames a second with "f32" alone, 1.24-1.26x
    with four sequences, 1.14-1.18x with eight, on a Zen 4: benchmarks/served_arithmetic.py),
    and without the integer kernels "ggml" rounds the activation for the float kernels, a
    pass that gains nothing. F32 files keep "ggml" (its products in ggml's order, from the
    mapped file, gave 1.11-1.24x the frames of "f32" alone, 0.96-1.05x with four and eight)."""
    return "ggml" if integer_kernels_expected() and f16_share <= 0.5 else "f32"


def numpy_capabilities(kv_cache_dtype: str = "f16", numba_kernels: bool | None = None,
                       arithmetic: str | None = None) -> Capabilities:
    """numba_kernels: F16, Q8_0 and block-quantized matrices kept in their file type; None =
    when numba is there. Each cache type is held as itself (CACHE_NUMPY_DTYPES). arithmetic:
    "ggml" (s2.cpp's activation rounding, act_quant.py) or "f32"; None (the probe) = the
    default, which depends on the file (default_arithmetic): stated as "ggml", the default for
    the files the integer kernels take, with F16 matrices copied as under "f32", as an f16
    file's default load copies them (`s2core info` then says so)."""
    if numba_kernels is None:
        numba_kernels = numba_available()
    # "ggml" multiplies F16 matrices in ggml's order from the file's own rows (ggml_ops.py)
    mapped = frozenset({"f32", "f16"}) if numba_kernels and arithmetic == "ggml" \
        else frozenset({"f32"})
    arithmetic = arithmetic or default_arithmetic()
    return Capabilities(device="cpu", accelerator=False, n_accelerated_layers=0,
                        kv_cache_dtype=kv_cache_dtype,
                        supported_kv_cache_dtypes=CACHE_DTYPES, compute_dtype="f32",
                        native_weight_types=frozenset({"f32"}) | (NUMBA_TYPES if numba_kernels
                                                                  else frozenset()),
                        widened_weight_dtype="f32", mapped_weight_types=mapped,
                        writes_kv_cache=True,
                        native_weight_overhead=(("q8_0", Q8_0_HELD_BYTES / 34),)
                        if numba_kernels else (), codec=numpy_codec_capabilities(),
                        max_batch_sequences=MAX_BATCH_SEQUENCES, shares_kv_prefix=True,
                        arithmetics=("ggml", "f32"), arithmetic=arithmetic, logit_rows=True)


def probe() -> Probe:
    reason = "NumPy runs on every CPU" + (
        "; numba computes from F16, Q8_0 and K-quant/legacy-quant weights as stored"
        if numba_available()
        else "; numba not installed (pip install s2core[fast]): F16 and quantized weights are "
             "widened to float32")
    if integer_kernels_expected():
        reason += ("; arithmetic \"ggml\" (the default, except for f16 files) multiplies 8-bit "
                   "codes in integers (AVX2 or AVX-512 VNNI)")
        if amx_expected():
            reason += ", on the AMX tile units for products of many rows (batches, prefills)"
    return Probe(available=True, reason=reason, capabilities=numpy_capabilities())


#: the keyword options NumpyBackend takes, checked by the core before the backend is imported
OPTIONS = (
    Option("kv_cache_dtype", choices=CACHE_DTYPES, default="f16",
           doc="type of the cached K/V values and of their memory (f16 as s2.cpp)"),
    Option("numba_kernels", choices=(None, True, False), default=None,
           doc="keep F16, Q8_0 and block-quantized matrices as stored and compute from them "
               "with numba (None: when numba is installed; False: widen them to float32)"),
    Option("arithmetic", choices=(None, "ggml", "f32"), default=None,
           doc="products with non-F32 weights: \"ggml\" rounds the activation as s2.cpp does "
               "(8-bit blocks, f16 for F16 weights), \"f32\" feeds it as float32 "
               "(None: \"ggml\" where numba's integer kernels run, AVX2 or AVX-512 VNNI, except for "
               "files of mostly F16 matrices; else \"f32\")"),
)


@hookimpl
def s2core_backends() -> list[BackendSpec]:
    return [BackendSpec(name="numpy", backend_class="s2core_numpy.backend:NumpyBackend",
                        probe=probe, priority=PRIORITY, options=OPTIONS,
                        codec_class="s2core_numpy.codec:NumpyCodec",
                        description="float32 NumPy/BLAS on the CPU; keeps F16, Q8_0 and the "
                                    "K-/legacy quants with numba, widens other types to float32")]
