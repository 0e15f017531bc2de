"""s2.cpp's arithmetic (`arithmetic="ggml"`), transcribed plainly for the float64 reference.

Before a product with a non-F32 weight, ggml's CPU backend converts the activation row to the
weight type's "dot type" and multiplies block by block in integers:

- Q4_0, Q5_0, Q8_0 weights: the activation as Q8_0. Per block of 32 values:
  amax = max |x|; d = amax / 127 (float32), stored as float16; inverse = 127 / amax (0 when
  amax is 0); code = round(x * inverse), ties to even (the x86 code's rounding).
  Block dot: sum(weight code * code) * d_weight * d.
- Q4_1, Q5_1 weights: the activation as Q8_1: Q8_0's codes and d, plus
  s = float16(d_unrounded * sum(codes)). Block dot: sum(code_w * code) * d_w * d + m_w * s.
- Q2_K..Q6_K weights: the activation as Q8_K. Per block of 256: `peak` = the first value of
  largest magnitude (its sign kept); iscale = -127 / peak; code = min(127, round(iscale * x)),
  ties to even; d = 1 / iscale, float32. Block dot: d * (d_w * sum over sub-blocks of
  scale * sum(code_w * code) - dmin_w * sum over sub-blocks of min * sum(code)).
- F16 weights: the activation rounded to float16; BF16 weights: to bfloat16.

Every quantity above is float32 arithmetic, reproduced here with numpy float32 scalars. The
block dot's integer sums times the weight's scales are, in exact arithmetic, the weight's
dequantized values (gguf's) times d * code: so the reference multiplies the dequantized weight
(float64) by the activation's block values d * code (float64 products and sums), and adds
Q8_1's one term that is not such a product, m_w * (s - d * sum(codes)).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

#: the activation format ("dot type") ggml converts to, by weight type; other types (F32)
#: take the activation as it is
DOT_TYPE = {QT.Q4_0: "q8_0", QT.Q5_0: "q8_0", QT.Q8_0: "q8_0", QT.Q4_1: "q8_1",
            QT.Q5_1: "q8_1", QT.Q2_K: "q8_k", QT.Q3_K: "q8_k", QT.Q4_K: "q8_k",
            QT.Q5_K: "q8_k", QT.Q6_K: "q8_k", QT.F16: "f16", QT.BF16: "bf16"}

f32 = np.float32


def quantize_q8_0_block(x: np.ndarray) -> tuple[np.ndarray, float, float]:
    """One block of 32 float32 values -> (codes, d as stored (float16), d unrounded)."""
    amax = f32(0)
    for v in x:
        amax = max(amax, abs(f32(v)))
    d = f32(amax / f32(127))
    inverse = f32(f32(127) / amax) if amax != 0 else f32(0)
    codes = np.array([np.rint(f32(f32(v) * inverse)) for v in x], np.int64)
    return codes, float(np.float16(d)), float(d)


def quantize_q8_k_block(x: np.ndarray) -> tuple[np.ndarray, float]:
    """One block of 256 float32 values -> (codes, d float32)."""
    amax, peak = f32(0), f32(0)
    for v in x:
        if abs(f32(v)) > amax:
            amax, peak = abs(f32(v)), f32(v)
    if amax == 0:
        return np.zeros(len(x), np.int64), 0.0
    iscale = f32(f32(-127) / peak)
    codes = np.array([min(127, int(np.rint(f32(iscale * f32(v))))) for v in x], np.int64)
    return codes, float(f32(f32(1) / iscale))


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def activation_row(x: np.ndarray, dot_type: str) -> tuple[np.ndarray, np.ndarray | None]:
    """One activation row as ggml converts it: (its values d * code per block, float64;
    for Q8_1 the per-block s - d * sum(codes), else None)."""
    x = np.asarray(x, np.float32)
    if dot_type == "f16":
        return x.astype(np.float16).astype(np.float64), None
    if dot_type == "bf16":
        return round_bf16(x).astype(np.float64), None
    out = np.empty(len(x))
    if dot_type == "q8_k":
        for b in range(0, len(x), 256):
            codes, d = quantize_q8_k_block(x[b:b + 256])
            out[b:b + 256] = d * codes
        return out, None
    s_error = np.empty(len(x) // 32)
    for b in range(0, len(x), 32):
        codes, d16, d = quantize_q8_0_block(x[b:b + 32])
        out[b:b + 32] = d16 * codes
        s = float(np.float16(f32(f32(d) * f32(codes.sum()))))
        s_error[b // 32] = s - d16 * codes.sum()
    return out, (s_error if dot_type == "q8_1" else None)


def ggml_product(x: np.ndarray, weight: np.ndarray, qtype: QT,
                 block_mins: np.ndarray | None = None) -> np.ndarray:
    """x (..., in) times weight (out, in) (float64, gguf's dequantized values) as ggml computes
    it for a weight of type qtype. block_mins (out, in / 32): Q4_1/Q5_1's block mins."""
    dot_type = DOT_TYPE.get(qtype)
    if dot_type is None:
        return x @ weight.T
    rows = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
    out = np.empty((rows.shape[0], weight.shape[0]))
    for r, row in enumerate(rows):
        values, s_error = activation_row(row, dot_type)
        out[r] = weight @ values
        if s_error is not None:
            out[r] += block_mins @ s_error
    return out.reshape(*x.shape[:-1], weight.shape[0])


def block_mins_of(raw: np.ndarray, nbytes: int) -> np.ndarray:
    """Q4_1/Q5_1: the float16 m of each block (its bytes 2 and 3), (out, blocks) float64."""
    blocks = np.asarray(raw, np.uint8).reshape(raw.shape[0], -1, nbytes)
    return np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16)[..., 0].astype(np.float64)
