"""s2.cpp's arithmetic (`arithmetic="ggml"`): the activation rounding ggml's CPU backend does
before every product with a non-F32 weight, and a matrix that applies it.

ggml multiplies a quantized or F16 weight by an activation first converted to the weight
type's "dot type", one product at a time:

- Q8_0 (Q4_0, Q5_0, Q8_0 weights): blocks of 32; d = max|x| / 127 stored as float16;
  codes round(x * 127 / max|x|), ties to even (x86's `_mm256_round_ps`, nearest).
- Q8_1 (Q4_1, Q5_1): the same codes and d, plus s = float16(d * sum of the codes) (d unrounded),
  which the dot multiplies by the weight block's min instead of the exact sum.
- Q8_K (the K-quants): blocks of 256; the value of largest magnitude `max` (sign kept, the
  first such); iscale = -127 / max; codes min(127, round(iscale * x)), ties to even; d =
  1 / iscale kept as float32.
- F16 weights: the activation rounded to float16; BF16 weights: to bfloat16.

The dot of a block is then an integer sum of code products times the two scales. In exact
arithmetic that equals the float product of the weight with the activation's block values
d * code (the "snapped" activation): this module snaps the activation, exactly as ggml rounds
it, and the weight's own kernels multiply it (float32 accumulation, ggml's numbers up to the
order of float32 sums: ~1e-7 relative). The one term that is not a function of the snapped
values is Q8_1's float16 s: `ActivationRounded` adds its difference times the weight's block
mins.

s2core.kit.ggml_arithmetic is the independent float64 transcription the kit checks this against.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT

from s2core.plugin import block_shape

#: the dot type ggml converts the activation to, by weight type
DOT_TYPE: dict[QT, str] = {
    QT.Q4_0: "q8_0", QT.Q5_0: "q8_0", QT.Q8_0: "q8_0",
    QT.Q4_1: "q8_1", QT.Q5_1: "q8_1",
    QT.Q2_K: "q8_k", QT.Q3_K: "q8_k", QT.Q4_K: "q8_k", QT.Q5_K: "q8_k", QT.Q6_K: "q8_k",
    QT.F16: "f16", QT.BF16: "bf16",
}

_F32 = np.float32

try:  # the same numbers, vectorized per block (numpy's forms below: ~5x the time)
    from . import act_quant_kernels as _kernels
except ImportError:  # no numba
    _kernels = None


def _q8_codes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0/Q8_1 codes (float32 integers) and unrounded d of blocks (..., 32), in float32 as
    ggml's x86 code computes them."""
    if _kernels is not None:
        codes, d, _ = _kernels.quantize_blocks(
            np.ascontiguousarray(blocks.reshape(-1, 32), _F32), True)
        return codes.astype(_F32).reshape(blocks.shape), d.reshape(blocks.shape[:-1])
    amax = np.abs(blocks).max(axis=-1)
    d = amax / _F32(127)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax != 0, _F32(127) / amax, _F32(0)).astype(_F32)
    return np.rint(blocks * inverse[..., None]), d


def snap_q8_0(x: np.ndarray) -> np.ndarray:
    """x (n, in) float32 -> float16(d) * codes, per block of 32."""
    blocks = x.reshape(x.shape[0], -1, 32)
    codes, d = _q8_codes(blocks)
    d16 = d.astype(np.float16).astype(_F32)
    return (codes * d16[..., None]).reshape(x.shape)


def snap_q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(snapped x as snap_q8_0, s_error (n, in / 32)): per block, ggml's float16
    s = fp16(d * sum(codes)) less the exact sum of the snapped values."""
    blocks = x.reshape(x.shape[0], -1, 32)
    codes, d = _q8_codes(blocks)
    d16 = d.astype(np.float16).astype(_F32)
    total = codes.sum(axis=-1, dtype=np.float64)  # integers, exact
    s = (d * total.astype(_F32)).astype(np.float16).astype(np.float64)
    s_error = (s - d16.astype(np.float64) * total).astype(_F32)
    return (codes * d16[..., None]).reshape(x.shape), s_error


def snap_q8_k(x: np.ndarray) -> np.ndarray:
    """x (n, in) float32 -> d * codes per block of 256 (d = 1 / iscale, float32)."""
    blocks = x.reshape(x.shape[0], -1, 256)
    if _kernels is not None:
        codes, d, _ = _kernels.quantize_blocks(
            np.ascontiguousarray(blocks.reshape(-1, 256), _F32), False)
        return (codes.astype(_F32) * d[:, None]).reshape(x.shape)
    first = np.abs(blocks).argmax(axis=-1)  # the first of largest magnitude, as ggml's scan
    peak = np.take_along_axis(blocks, first[..., None], axis=-1)[..., 0]
    with np.errstate(divide="ignore"):
        iscale = np.where(peak != 0, _F32(-127) / peak, _F32(0)).astype(_F32)
        d = np.where(peak != 0, _F32(1) / iscale, _F32(0)).astype(_F32)
    codes = np.minimum(np.rint(blocks * iscale[..., None]), _F32(127))
    return (codes * d[..., None]).reshape(x.shape)


def snap_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even bfloat16 (ggml's fp32 -> bf16 for finite values)."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(_F32)


def snap(dot_type: str, x: np.ndarray) -> np.ndarray:
    """The activation rows as ggml rounds them for this dot type (Q8_1's s aside)."""
    if dot_type == "q8_0":
        return snap_q8_0(x)
    if dot_type == "q8_1":
        return snap_q8_1(x)[0]
    if dot_type == "q8_k":
        return snap_q8_k(x)
    if dot_type == "f16":
        return x.astype(np.float16).astype(_F32)
    if dot_type == "bf16":
        return snap_bf16(x)
    raise ValueError(f"no dot type {dot_type!r}")


def quantize(dot_type: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows x (n, in) as ggml's int8 codes for the integer kernels (int_dots.py):
    (codes (n, in) int8, d (n, blocks) float32 as the dot uses it (Q8_0: float16-rounded),
    sums of the codes per 16 inputs (n, in / 16) int32). Needs numba and the integer
    kernels' CPU (act_quant_kernels.integer_codes; its callers have both)."""
    if dot_type not in ("q8_0", "q8_k"):
        raise ValueError(f"no integer codes for dot type {dot_type!r}")
    return _kernels.integer_codes(np.ascontiguousarray(x, dtype=_F32), dot_type == "q8_0")


def block_mins(raw: np.ndarray, qtype: QT) -> np.ndarray:
    """The float16 min m of every Q4_1/Q5_1 block (bytes 2-3 of each), (O, blocks) float32."""
    nbytes = block_shape(qtype)[1]
    blocks = np.ascontiguousarray(raw, np.uint8).reshape(raw.shape[0], -1, nbytes)
    return np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16)[..., 0].astype(_F32)


class ActivationRounded:
    """A weight (float32 array or a kept-type matrix) multiplied as ggml multiplies it: the
    activation rows rounded to the weight's dot type first. Lookups are the weight's own."""

    def __init__(self, weight: Any, dot_type: str, mins: np.ndarray | None = None):
        self.weight = weight
        self.dot_type = dot_type
        self.mins = mins  # Q4_1/Q5_1: the block mins, for Q8_1's float16 s

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=_F32)
        if self.dot_type == "q8_1":
            snapped, s_error = snap_q8_1(x)
            out = self._product(snapped)
            return out + s_error @ self.mins.T
        return self._product(snap(self.dot_type, x))

    def _product(self, x: np.ndarray) -> np.ndarray:
        if isinstance(self.weight, np.ndarray):
            return x @ self.weight.T
        return self.weight(x)

    def row_window(self, start: int, stop: int, n: int) -> tuple["ActivationRounded", int] | None:
        """weights.row_window of the weight, rounding activations as before."""
        if isinstance(self.weight, np.ndarray):  # multiplied by BLAS (weights.row_window)
            return None
        window = self.weight.row_window(start, stop, n)
        if window is None:
            return None
        inner, lead = window
        first = start - lead
        mins = None if self.mins is None else self.mins[first:first + inner.shape[0]]
        return ActivationRounded(inner, self.dot_type, mins), lead

    def rows(self, ids: np.ndarray) -> np.ndarray:
        if isinstance(self.weight, np.ndarray):
            return self.weight[ids].astype(_F32)
        return self.weight.rows(ids)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + (0 if self.mins is None else self.mins.nbytes)
