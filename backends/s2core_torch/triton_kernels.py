"""Triton kernels that compute from GGUF quantized blocks as stored (the CUDA path).

Two kernels share one decoder (`_decode`: a tile of weights from the blocks, in registers):
- `qmv`: out = x @ W^T for a few rows of x, straight from the blocks: a decode step reads each
  weight's bytes once (a q4_k matrix is 4.5 bits a weight where its f16 copy was 16);
- `dequantize_into`: W (a slab of its rows) into a buffer of the compute type, for products of
  many rows, which then run on cuBLAS (a prefill is bound by arithmetic, not by weight bytes).

The decoder reproduces gguf's dequantization (gguf.quants) value for value: every scale is a
float16 times a small integer, exact in float32, and the last operation is the same (on a GPU
the compiler may fuse `d * q + m` into one fma, a difference of at most one rounding).

Each element is decoded from its own bytes: a tile loads the bytes its values live in (the
scale fields are shared by a block's values and served from the cache), which keeps the kernel
one small function per type. Tested on the CPU with Triton's interpreter (TRITON_INTERPRET=1
before this module is imported), against gguf's dequantization and torch's.

Importing this module imports triton: only the CUDA path (and the tests) do.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType as QT

from s2core.plugin import block_shape

#: the GGUF types the kernels decode (QTYPE is the type's GGML number)
SUPPORTED_TYPES = frozenset({QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1,
                             QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K})

#: the kernels run under Triton's interpreter (NumPy on the CPU), not compiled
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
#: columns per tile: one K-quant super-block, eight legacy blocks
BLOCK_K = 256
#: output rows per program of qmv / rows per program of dequantize_into. The interpreter runs
#: programs one after another at ~30 ms each whatever their size: far fewer, larger ones there
QMV_BLOCK_N = 128 if INTERPRETED else 16
DEQUANT_BLOCK_N = 128 if INTERPRETED else 16


@triton.jit
def _f16(ptr, mask):
    """The little-endian float16 at byte pointer(s) `ptr` (every scale field sits at an even
    offset of an even-sized block), as float32."""
    return tl.load(ptr.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _u8(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def _i8(ptr, mask):
    b = _u8(ptr, mask)
    return b - ((b & 128) << 1)  # two's complement byte -> -128..127


@triton.jit
def _decode(w_ptr, rows, cols, row_bytes, mask, QTYPE: tl.constexpr):
    """float32 weights W[rows, cols] (rows a column, cols a row of indices: a 2-D tile)."""
    row_start = w_ptr + rows.to(tl.int64) * row_bytes
    if QTYPE == 8:  # Q8_0: d, qs[32] int8
        base = row_start + (cols // 32) * 34
        out = _i8(base + 2 + cols % 32, mask).to(tl.float32) * _f16(base, mask)
    elif QTYPE == 2:  # Q4_0: d, qs[16] (values 0..15 low nibbles, 16..31 high)
        j = cols % 32
        base = row_start + (cols // 32) * 18
        q = (_u8(base + 2 + j % 16, mask) >> ((j // 16) * 4)) & 0xF
        out = _f16(base, mask) * (q - 8).to(tl.float32)
    elif QTYPE == 3:  # Q4_1: d, m, qs[16]
        j = cols % 32
        base = row_start + (cols // 32) * 20
        q = (_u8(base + 4 + j % 16, mask) >> ((j // 16) * 4)) & 0xF
        out = _f16(base, mask) * q.to(tl.float32) + _f16(base + 2, mask)
    elif QTYPE == 6:  # Q5_0: d, qh (32 high bits), qs[16]
        j = cols % 32
        base = row_start + (cols // 32) * 22
        high = (_u8(base + 2 + j // 8, mask) >> (j % 8)) & 1
        q = ((_u8(base + 6 + j % 16, mask) >> ((j // 16) * 4)) & 0xF) | (high << 4)
        out = _f16(base, mask) * (q - 16).to(tl.float32)
    elif QTYPE == 7:  # Q5_1: d, m, qh, qs[16]
        j = cols % 32
        base = row_start + (cols // 32) * 24
        high = (_u8(base + 4 + j // 8, mask) >> (j % 8)) & 1
        q = ((_u8(base + 8 + j % 16, mask) >> ((j // 16) * 4)) & 0xF) | (high << 4)
        out = _f16(base, mask) * q.to(tl.float32) + _f16(base + 2, mask)
    elif QTYPE == 10:  # Q2_K: scales[16] (scale | min << 4), qs[64], d, dmin
        j = cols % 256
        base = row_start + (cols // 256) * 84
        sm = _u8(base + j // 16, mask)
        dl = _f16(base + 80, mask) * (sm & 0xF).to(tl.float32)
        ml = _f16(base + 82, mask) * (sm >> 4).to(tl.float32)
        q = (_u8(base + 16 + (j // 128) * 32 + j % 32, mask) >> (((j % 128) // 32) * 2)) & 3
        out = dl * q.to(tl.float32) - ml
    elif QTYPE == 11:  # Q3_K: hmask[32], qs[64], scales[12] (16 six-bit), d
        j = cols % 256
        base = row_start + (cols // 256) * 110
        s = j // 16
        low = (_u8(base + 96 + s % 8, mask) >> ((s // 8) * 4)) & 0xF
        high = (_u8(base + 104 + s % 4, mask) >> ((s // 4) * 2)) & 3
        dl = _f16(base + 108, mask) * ((low | (high << 4)) - 32).to(tl.float32)
        ql = (_u8(base + 32 + (j // 128) * 32 + j % 32, mask) >> (((j % 128) // 32) * 2)) & 3
        hbit = (_u8(base + j % 32, mask) >> (j // 32)) & 1
        out = dl * (ql - 4 * (1 - hbit)).to(tl.float32)  # the -4 where the mask bit is clear
    elif QTYPE == 12 or QTYPE == 13:  # Q4_K / Q5_K: d, dmin, scales[12], (qh[32],) qs[128]
        j = cols % 256
        if QTYPE == 12:
            base = row_start + (cols // 256) * 144
            qs_at = 16
        else:
            base = row_start + (cols // 256) * 176
            qs_at = 48
        s = j // 32  # eight sub-blocks of 32, 6-bit scale and min each
        lo = _u8(base + 4 + s % 4, mask)
        hi = _u8(base + 8 + s % 4, mask)
        mixed = _u8(base + 12 + s % 4, mask)
        sc = tl.where(s < 4, lo & 63, (mixed & 0xF) | ((lo >> 6) << 4))
        mn = tl.where(s < 4, hi & 63, (mixed >> 4) | ((hi >> 6) << 4))
        q = (_u8(base + qs_at + (s // 2) * 32 + j % 32, mask) >> ((s % 2) * 4)) & 0xF
        if QTYPE == 13:
            q = q | (((_u8(base + 16 + j % 32, mask) >> s) & 1) << 4)
        d = _f16(base, mask) * sc.to(tl.float32)
        out = d * q.to(tl.float32) - _f16(base + 2, mask) * mn.to(tl.float32)
    else:  # QTYPE == 14, Q6_K: ql[128], qh[64], scales[16] int8, d
        tl.static_assert(QTYPE == 14)
        j = cols % 256
        base = row_start + (cols // 256) * 210
        r = j % 128
        low = (_u8(base + (j // 128) * 64 + r % 64, mask) >> ((r // 64) * 4)) & 0xF
        high = (_u8(base + 128 + (j // 128) * 32 + r % 32, mask) >> ((r // 32) * 2)) & 3
        dl = _f16(base + 208, mask) * _i8(base + 192 + j // 16, mask).to(tl.float32)
        out = dl * ((low | (high << 4)) - 32).to(tl.float32)
    return out


@triton.jit
def _qmv_kernel(x_ptr, w_ptr, out_ptr, N, K, row_bytes, stride_x, stride_out,
                QTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[m, rows] = x[m] . W[rows] for one row m of x (program axis 1) and BLOCK_N rows of W
    (axis 0); float32 accumulation. The programs of other m read the same tile from cache."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.program_id(1).to(tl.int64)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + m * stride_x + cols, mask=cols < K, other=0.0).to(tl.float32)
        mask = (rows[:, None] < N) & (cols[None, :] < K)
        w = _decode(w_ptr, rows[:, None], cols[None, :], row_bytes, mask, QTYPE)
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(out_ptr + m * stride_out + rows, acc.to(out_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def _dequantize_kernel(w_ptr, out_ptr, N, K, row_bytes, stride_out,
                       QTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows[:, None] < N) & (cols[None, :] < K)
    w = _decode(w_ptr, rows[:, None], cols[None, :], row_bytes, mask, QTYPE)
    out = out_ptr + rows[:, None].to(tl.int64) * stride_out + cols[None, :]
    tl.store(out, w.to(out_ptr.dtype.element_ty), mask=mask)


def _check(blocks: torch.Tensor, qtype: QT) -> tuple[int, int]:
    if qtype not in SUPPORTED_TYPES:
        raise ValueError(f"no Triton kernel decodes {qtype.name}")
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or not blocks.is_contiguous():
        raise ValueError("blocks must be a contiguous uint8 (rows, bytes per row) tensor")
    values, nbytes = block_shape(qtype)
    return blocks.shape[0], blocks.shape[1] // nbytes * values


def qmv(x: torch.Tensor, blocks: torch.Tensor, qtype: QT, out_dtype: torch.dtype) -> torch.Tensor:
    """x (m, in) @ W^T -> (m, out) in `out_dtype`, W given by its raw GGUF rows (out, bytes)."""
    n, k = _check(blocks, qtype)
    x = x.contiguous()
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} columns, the weight {k}")
    out = torch.empty((x.shape[0], n), dtype=out_dtype, device=x.device)
    grid = (triton.cdiv(n, QMV_BLOCK_N), x.shape[0])
    _qmv_kernel[grid](x, blocks, out, n, k, blocks.shape[1], x.stride(0), out.stride(0),
                      QTYPE=int(qtype), BLOCK_N=QMV_BLOCK_N, BLOCK_K=BLOCK_K)
    return out


def dequantize_into(blocks: torch.Tensor, qtype: QT, out: torch.Tensor) -> torch.Tensor:
    """Decode raw rows (rows, bytes) into `out` (rows, values), any float dtype; returns out."""
    n, k = _check(blocks, qtype)
    if out.shape != (n, k) or out.stride(1) != 1:
        raise ValueError(f"out must be ({n}, {k}) with contiguous rows, got {tuple(out.shape)}")
    grid = (triton.cdiv(n, DEQUANT_BLOCK_N), triton.cdiv(k, BLOCK_K))
    _dequantize_kernel[grid](blocks, out, n, k, blocks.shape[1], out.stride(0),
                             QTYPE=int(qtype), BLOCK_N=DEQUANT_BLOCK_N, BLOCK_K=BLOCK_K)
    return out
