"""s2.cpp's arithmetic (`arithmetic="ggml"`) in Triton: the activation rows quantized as ggml
quantizes them, then integer dot products per block and ggml's float step per block.

Activation quantization (bit for bit ggml's x86 code, and NumPy's act_quant.quantize):
- Q8_0 (the dot type of Q4_0, Q5_0, Q8_0 weights; Q8_1's codes and d too): per 32 values,
  amax = max |x|, d = amax / 127, codes = rint(x * (127 / amax)); the dot takes d as float16;
- Q8_K (the K-quants): per 256 values, the first value of largest magnitude `peak` (its sign
  kept), iscale = -127 / peak, codes = min(127, rint(iscale * x)), d = 1 / iscale.
Divisions are `div_rn` (IEEE, as the CPU divides: Triton's `/` may be approximate on CUDA),
and rint is the 1.5 * 2^23 addition (nearest, ties to even, as x86's rounding) with the
compiler's multiply-add fusion turned off, so that x * inverse is rounded before it is rounded
to an integer, as on the CPU.

Integer products (`int_dot`, Q8_0, Q4_K and Q6_K weights: the types of q8_0 and q4_k_m files):
per block, `tl.dot` of the activation codes (int8) with the weight codes decoded from the
blocks (int8), accumulated in int32, exact; then per block and output row ggml's float step:
- Q8_0: sum += (d_w * d_x) * isum;
- Q4_K: sum += (d_w * d_x) * (sum_s sc_s * isum_s) - (dmin_w * d_x) * (sum_s m_s * xsum_s),
  eight sub-blocks s of 32, xsum_s the sum of the activation codes of sub-block s;
- Q6_K: sum += (d_w * d_x) * (sum_s sc_s * (isum_s - 32 * xsum_s)), sixteen sub-blocks of 16
  (weight codes 0..63 stored with a bias of 32).
The integer parts are exact as in ggml; the float sums over blocks are in this kernel's order
(ggml's depends on its SIMD width): ~1e-7 relative, as NumPy's integer kernels (int_dots.py).

The other quantized types take the activation as its block values d * code (`snapped`), which
the float kernels (triton_kernels.py) multiply: in exact arithmetic the same product.

Tested on the CPU with Triton's interpreter (TRITON_INTERPRET=1 before triton is imported)
against s2core.kit.ggml_arithmetic and NumPy's act_quant.quantize.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType as QT

from s2core.plugin import block_shape

#: weight types with integer kernels here, and the activation format each takes
INTEGER_TYPES = frozenset({QT.Q8_0, QT.Q4_K, QT.Q6_K})
#: the dot type ggml converts the activation to, by weight type (act_quant.DOT_TYPE)
DOT_TYPE = {QT.Q4_0: "q8_0", QT.Q5_0: "q8_0", QT.Q8_0: "q8_0", QT.Q4_1: "q8_1",
            QT.Q5_1: "q8_1", QT.Q2_K: "q8_k", QT.Q3_K: "q8_k", QT.Q4_K: "q8_k",
            QT.Q5_K: "q8_k", QT.Q6_K: "q8_k"}
#: values per activation block, by dot type
BLOCK_VALUES = {"q8_0": 32, "q8_1": 32, "q8_k": 256}

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
#: activation blocks per program of the quantizers
QUANT_BLOCKS = 64 if INTERPRETED else 8
#: activation rows x weight rows per program of int_dot (tl.dot wants 16 at least); the
#: interpreter runs programs one after another: fewer, larger ones there
DOT_BLOCK_M = 16
DOT_BLOCK_N = 128 if INTERPRETED else 64
#: inputs per tl.dot (int8 dots take 32 at least): a Q8_0 block, a Q4_K sub-block, two Q6_K ones
DOT_K = 32
#: rounds a float32 below 2^22 in magnitude to the nearest integer, ties to even
ROUNDER = 12582912.0
#: launch options: no multiply-add fusion (x * inverse must be rounded before + ROUNDER)
_EXACT = {} if INTERPRETED else {"enable_fp_fusion": False}


@triton.jit
def _rint(v):
    return (v + ROUNDER) - ROUNDER


@triton.jit
def _q8_0_quantize_kernel(x_ptr, codes_ptr, d_ptr, n_blocks, BLOCKS: tl.constexpr):
    """x (n_blocks, 32) float32 -> codes int8, d (unrounded amax / 127) float32."""
    b = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    at = b[:, None].to(tl.int64) * 32 + tl.arange(0, 32)[None, :]
    mask = b[:, None] < n_blocks
    x = tl.load(x_ptr + at, mask=mask, other=0.0)
    amax = tl.max(tl.abs(x), axis=1)
    d = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))
    nonzero = amax != 0
    inverse = tl.where(nonzero, tl.math.div_rn(tl.full(amax.shape, 127.0, tl.float32),
                                               tl.where(nonzero, amax, 1.0)), 0.0)
    codes = _rint(x * inverse[:, None])
    tl.store(codes_ptr + at, codes.to(tl.int8), mask=mask)
    tl.store(d_ptr + b, d, mask=b < n_blocks)


@triton.jit
def _q8_k_quantize_kernel(x_ptr, codes_ptr, d_ptr, n_blocks, BLOCKS: tl.constexpr):
    """x (n_blocks, 256) float32 -> Q8_K codes int8, d = 1 / iscale float32."""
    b = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    i = tl.arange(0, 256)
    at = b[:, None].to(tl.int64) * 256 + i[None, :]
    mask = b[:, None] < n_blocks
    x = tl.load(x_ptr + at, mask=mask, other=0.0)
    magnitude = tl.abs(x)
    amax = tl.max(magnitude, axis=1)
    # the first value of largest magnitude, sign kept (ggml's scan keeps the first)
    first = tl.min(tl.where(magnitude == amax[:, None], i[None, :], 256), axis=1)
    peak = tl.sum(tl.where(i[None, :] == first[:, None], x, 0.0), axis=1)
    nonzero = amax != 0
    iscale = tl.math.div_rn(tl.full(amax.shape, -127.0, tl.float32), tl.where(nonzero, peak, 1.0))
    d = tl.where(nonzero, tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), iscale), 0.0)
    codes = tl.minimum(_rint(x * iscale[:, None]), 127.0)
    codes = tl.where(nonzero[:, None], codes, 0.0)
    tl.store(codes_ptr + at, codes.to(tl.int8), mask=mask)
    tl.store(d_ptr + b, d, mask=b < n_blocks)


def quantize(dot_type: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows x (m, in) float32 as ggml's int8 codes (m, in) and d per block (m, blocks)
    float32, unrounded (Q8_0's dot takes it as float16: `dot_scales`)."""
    size = BLOCK_VALUES[dot_type]
    x = x.to(torch.float32).contiguous()
    m, width = x.shape
    if width % size:
        raise ValueError(f"{dot_type}: rows of {width} values are not whole blocks of {size}")
    codes = torch.empty((m, width), dtype=torch.int8, device=x.device)
    d = torch.empty((m, width // size), dtype=torch.float32, device=x.device)
    n_blocks = m * width // size
    kernel = _q8_k_quantize_kernel if size == 256 else _q8_0_quantize_kernel
    kernel[(triton.cdiv(n_blocks, QUANT_BLOCKS),)](x, codes, d, n_blocks, BLOCKS=QUANT_BLOCKS,
                                                   **_EXACT)
    return codes, d


def dot_scales(dot_type: str, d: torch.Tensor) -> torch.Tensor:
    """d as the block dot multiplies it: Q8_0/Q8_1 store it as float16."""
    return d if dot_type == "q8_k" else d.half().float()


def snapped(dot_type: str, x: torch.Tensor) -> torch.Tensor:
    """The rows x as their block values d * code (float32), as ggml rounds them."""
    codes, d = quantize(dot_type, x)
    size = BLOCK_VALUES[dot_type]
    blocks = codes.float().view(x.shape[0], -1, size) * dot_scales(dot_type, d)[..., None]
    return blocks.view(x.shape)


def q8_1_s_error(x: torch.Tensor) -> torch.Tensor:
    """Q8_1 (Q4_1/Q5_1 weights): per block, ggml's s = float16(d * sum of the codes) (d
    unrounded) less the sum of the snapped values, which the dot multiplies by the weight
    block's min (m, in / 32) float32."""
    codes, d = quantize("q8_1", x)
    total = codes.view(x.shape[0], -1, 32).sum(dim=-1, dtype=torch.int32)  # exact
    s = (d * total.float()).half().double()
    return (s - d.half().double() * total.double()).float()


def block_mins(blocks: torch.Tensor, qtype: QT) -> torch.Tensor:
    """Q4_1/Q5_1: the float16 min of each block (its bytes 2-3), (rows, blocks) float32."""
    nbytes = block_shape(qtype)[1]
    per_block = blocks.view(blocks.shape[0], -1, nbytes)
    return per_block[:, :, 2:4].contiguous().view(torch.float16)[..., 0].float()


# ------------------------------------------------------------------ integer products
@triton.jit
def _u8(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16(ptr, mask):
    """The little-endian float16 at byte pointer(s) `ptr` (even offsets), as float32."""
    return tl.load(ptr.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _int_dot_kernel(xq_ptr, xd_ptr, w_ptr, out_ptr, M, N, K, row_bytes, n_d,
                    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[m, n] = sum over blocks of ggml's float step of the integer block dots of the
    activation codes xq (M, K) int8 (scales xd (M, n_d) float32, as the dot takes them) and
    weight rows n (raw blocks, row_bytes each)."""
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, 32)
    m_ok, n_ok = m < M, n < N
    x_rows = xq_ptr + m[:, None].to(tl.int64) * K + k[None, :]      # (BLOCK_M, 32)
    w_rows = w_ptr + n[None, :].to(tl.int64) * row_bytes             # (1, BLOCK_N)
    w_mask = n_ok[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if QTYPE == 8:  # Q8_0: d, qs[32] int8; one activation d per block of 32
        for blk in range(K // 32):
            base = w_rows + blk * 34                                 # (1, BLOCK_N)
            xq = tl.load(x_rows + blk * 32, mask=m_ok[:, None], other=0)
            wq = tl.load((base + 2 + k[:, None]).to(tl.pointer_type(tl.int8)), mask=w_mask,
                         other=0)                                    # (32, BLOCK_N)
            isum = tl.dot(xq, wq, out_dtype=tl.int32)
            d_w = _f16(base, w_mask)                                 # (1, BLOCK_N)
            d_x = tl.load(xd_ptr + m * n_d + blk, mask=m_ok, other=0.0)
            acc += (d_w * d_x[:, None]) * isum.to(tl.float32)
    else:
        for sb in range(K // 256):
            d_x = tl.load(xd_ptr + m * n_d + sb, mask=m_ok, other=0.0)[:, None]
            isc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
            if QTYPE == 12:  # Q4_K: d, dmin, scales[12] (8 x 6-bit scale and min), qs[128]
                base = w_rows + sb * 144
                imin = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
                for s in tl.static_range(8):
                    xq = tl.load(x_rows + sb * 256 + s * 32, mask=m_ok[:, None], other=0)
                    byte = _u8(base + 16 + (s // 2) * 32 + k[:, None], w_mask)
                    wq = ((byte >> ((s % 2) * 4)) & 0xF).to(tl.int8)
                    lo = _u8(base + 4 + s % 4, w_mask)
                    hi = _u8(base + 8 + s % 4, w_mask)
                    if s < 4:
                        sc = lo & 63
                        mn = hi & 63
                    else:
                        mixed = _u8(base + 12 + s % 4, w_mask)
                        sc = (mixed & 0xF) | ((lo >> 6) << 4)
                        mn = (mixed >> 4) | ((hi >> 6) << 4)
                    isc += tl.dot(xq, wq, out_dtype=tl.int32) * sc
                    imin += tl.sum(xq.to(tl.int32), axis=1)[:, None] * mn
                d_w = _f16(base, w_mask)
                dmin_w = _f16(base + 2, w_mask)
                acc += (d_w * d_x) * isc.to(tl.float32) - (dmin_w * d_x) * imin.to(tl.float32)
            else:  # Q6_K: ql[128], qh[64], scales[16] int8, d; codes q - 32, q in 0..63
                tl.static_assert(QTYPE == 14)
                base = w_rows + sb * 210
                upper = k[:, None] >= 16                             # second sub-block of 16
                for c in tl.static_range(8):                         # 32 inputs: j = 32c + k
                    xq = tl.load(x_rows + sb * 256 + c * 32, mask=m_ok[:, None], other=0)
                    r = (c % 4) * 32 + k[:, None]                    # j % 128
                    half = c // 4                                    # j // 128
                    low = (_u8(base + half * 64 + r % 64, w_mask) >> ((r // 64) * 4)) & 0xF
                    high = (_u8(base + 128 + half * 32 + r % 32, w_mask) >> ((r // 32) * 2)) & 3
                    q = low | (high << 4)                            # (32, BLOCK_N)
                    xsum = tl.sum(tl.reshape(xq.to(tl.int32), (BLOCK_M, 2, 16)), axis=2)
                    for h in tl.static_range(2):
                        if h == 0:
                            wq = tl.where(upper, 0, q).to(tl.int8)
                        else:
                            wq = tl.where(upper, q, 0).to(tl.int8)
                        isum = tl.dot(xq, wq, out_dtype=tl.int32)
                        sc = _u8(base + 192 + 2 * c + h, w_mask)
                        sc = sc - ((sc & 128) << 1)                  # int8 scale
                        xs = tl.sum(tl.where(tl.arange(0, 2)[None, :] == h, xsum, 0), axis=1)
                        isc += sc * (isum - 32 * xs[:, None])
                d_w = _f16(base + 208, w_mask)
                acc += (d_w * d_x) * isc.to(tl.float32)
    out = out_ptr + m[:, None].to(tl.int64) * N + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def int_dot(x: torch.Tensor, blocks: torch.Tensor, qtype: QT,
            out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x (m, in) float32 @ W^T as ggml computes it, W (out, in) given by its raw rows (out,
    bytes) of type Q8_0, Q4_K or Q6_K: x quantized to the dot type, integer block dots."""
    if qtype not in INTEGER_TYPES:
        raise ValueError(f"no integer Triton kernel for {qtype.name}")
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or not blocks.is_contiguous():
        raise ValueError("blocks must be a contiguous uint8 (rows, bytes per row) tensor")
    values, nbytes = block_shape(qtype)
    n, k = blocks.shape[0], blocks.shape[1] // nbytes * values
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be (rows, {k}), got {tuple(x.shape)}")
    dot_type = DOT_TYPE[qtype]
    xq, d = quantize(dot_type, x)
    xd = dot_scales(dot_type, d).contiguous()
    out = torch.empty((x.shape[0], n), dtype=out_dtype, device=x.device)
    grid = (triton.cdiv(n, DOT_BLOCK_N), triton.cdiv(x.shape[0], DOT_BLOCK_M))
    _int_dot_kernel[grid](xq, xd, blocks, out, x.shape[0], n, k, blocks.shape[1], xd.shape[1],
                          QTYPE=int(qtype), BLOCK_M=DOT_BLOCK_M, BLOCK_N=DOT_BLOCK_N)
    return out
