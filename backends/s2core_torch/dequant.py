"""GGUF quantized blocks -> float32, in torch ops, on whatever device the blocks are on.

The same arithmetic as gguf's own dequantization (gguf.quants), operation for operation, so
the values are bit for bit gguf's: every scale is a float16 times a small integer (exact in
float32), and the one rounding left (`d * q + m`, `dl * q - ml`) happens in the same order.

Used where the backend keeps quantized weights as stored (weights.QuantizedMatrix): to decode
the rows an embedding lookup gathers, and to dequantize a weight (a slab of rows at a time)
into a reused buffer for a product, on the CPU and on CUDA where the Triton kernels are not
used (triton_kernels.py does the same decoding inside its kernels).
"""

from __future__ import annotations

from typing import Callable

import torch
from gguf import GGMLQuantizationType as QT

from s2core.plugin import block_shape

QK_K = 256


def _shifts(values: tuple[int, ...], device: torch.device, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8, device=device).reshape(shape)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two bytes per block (n, 2) -> (n, 1) float32 (little-endian float16)."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 values: low nibbles are values 0..15, high ones 16..31."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """4 bytes (a little-endian uint32) -> its 32 bits, bit j at position j, as uint8."""
    n = qh.shape[0]
    return ((qh[:, :, None] >> _shifts(tuple(range(8)), qh.device, (1, 1, 8))) & 1).reshape(n, 32)


def _q8_0(b):
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, 0:2])


def _q4_0(b):
    q = _nibbles(b[:, 2:18]).to(torch.int8) - 8
    return _f16(b[:, 0:2]) * q.float()


def _q4_1(b):
    return _f16(b[:, 0:2]) * _nibbles(b[:, 4:20]).float() + _f16(b[:, 2:4])


def _q5_0(b):
    q = (_nibbles(b[:, 6:22]) | (_bits32(b[:, 2:6]) << 4)).to(torch.int8) - 16
    return _f16(b[:, 0:2]) * q.float()


def _q5_1(b):
    q = _nibbles(b[:, 8:24]) | (_bits32(b[:, 4:8]) << 4)
    return _f16(b[:, 0:2]) * q.float() + _f16(b[:, 2:4])


def _q2_k(b):
    # scales[16] (low nibble: scale, high: min), qs[64], d, dmin; 16 sub-blocks of 16
    n = b.shape[0]
    scales, qs = b[:, 0:16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & 0x0F).float()).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).reshape(n, 16, 1)
    q = (qs.reshape(n, 2, 1, 32) >> _shifts((0, 2, 4, 6), b.device, (1, 1, 4, 1))) & 3
    return (dl * q.reshape(n, 16, 16).float() - ml).reshape(n, QK_K)


def _q3_k(b):
    # hmask[32], qs[64], scales[12] (sixteen 6-bit values), d; 16 sub-blocks of 16
    n = b.shape[0]
    hmask, qs, scales, d = b[:, 0:32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = (scales[:, 0:8].reshape(n, 1, 8) >> _shifts((0, 4), b.device, (1, 2, 1))).reshape(n, 16)
    high = (scales[:, 8:12].reshape(n, 1, 4)
            >> _shifts((0, 2, 4, 6), b.device, (1, 4, 1))).reshape(n, 16)
    sc = ((low & 0x0F) | ((high & 0x03) << 4)).to(torch.int8) - 32
    dl = (d * sc.float()).reshape(n, 16, 1)
    ql = ((qs.reshape(n, 2, 1, 32) >> _shifts((0, 2, 4, 6), b.device, (1, 1, 4, 1))) & 3)
    qh = (hmask.reshape(n, 1, 1, 32) >> _shifts(tuple(range(8)), b.device, (1, 1, 8, 1))) & 1
    # the -4 offset applies where the mask bit is clear
    q = ql.reshape(n, 16, 16).to(torch.int8) - ((qh.reshape(n, 16, 16) ^ 1) << 2).to(torch.int8)
    return (dl * q.float()).reshape(n, QK_K)


def _k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit (scale, min) pairs of a Q4_K/Q5_K super-block from its 12 bytes."""
    lo, hi, mixed = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([lo & 0x3F, (mixed & 0x0F) | ((lo >> 2) & 0x30)], dim=-1)
    mn = torch.cat([hi & 0x3F, (mixed >> 4) | ((hi >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_low_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """128 bytes -> (n, 8, 32): sub-blocks 2i and 2i+1 are the low and high nibbles of
    bytes 32i..32i+31."""
    n = qs.shape[0]
    return ((qs.reshape(n, 4, 1, 32) >> _shifts((0, 4), qs.device, (1, 1, 2, 1))) & 0x0F
            ).reshape(n, 8, 32)


def _q4_k(b):
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    d = (_f16(b[:, 0:2]) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).reshape(n, 8, 1)
    return (d * _k_low_nibbles(b[:, 16:144]).float() - dm).reshape(n, QK_K)


def _q5_k(b):
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    d = (_f16(b[:, 0:2]) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).reshape(n, 8, 1)
    qh = (b[:, 16:48].reshape(n, 1, 1, 32)
          >> _shifts(tuple(range(8)), b.device, (1, 1, 8, 1))) & 1
    q = _k_low_nibbles(b[:, 48:176]) | (qh.reshape(n, 8, 32) << 4)
    return (d * q.float() - dm).reshape(n, QK_K)


def _q6_k(b):
    # ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] int8, d; 16 sub-blocks of 16
    n = b.shape[0]
    ql, qh, scales, d = b[:, 0:128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
    dl = (d * scales.contiguous().view(torch.int8).float()).reshape(n, 16, 1)
    low = ((ql.reshape(n, 2, 1, 64) >> _shifts((0, 4), b.device, (1, 1, 2, 1))) & 0x0F
           ).reshape(n, 8, 32)
    high = ((qh.reshape(n, 2, 1, 32) >> _shifts((0, 2, 4, 6), b.device, (1, 1, 4, 1))) & 3
            ).reshape(n, 8, 32)
    q = (low | (high << 4)).to(torch.int8) - 32
    return (dl * q.reshape(n, 16, 16).float()).reshape(n, QK_K)


_DECODERS: dict[QT, Callable[[torch.Tensor], torch.Tensor]] = {
    QT.Q8_0: _q8_0, QT.Q4_0: _q4_0, QT.Q4_1: _q4_1, QT.Q5_0: _q5_0, QT.Q5_1: _q5_1,
    QT.Q2_K: _q2_k, QT.Q3_K: _q3_k, QT.Q4_K: _q4_k, QT.Q5_K: _q5_k, QT.Q6_K: _q6_k,
}

SUPPORTED_TYPES = frozenset(_DECODERS)


def dequantize(blocks: torch.Tensor, qtype: QT) -> torch.Tensor:
    """Raw rows (rows, bytes per row) uint8 -> (rows, values per row) float32, same device."""
    values, nbytes = block_shape(qtype)
    rows, row_bytes = blocks.shape
    if row_bytes % nbytes:
        raise ValueError(f"{qtype.name}: a row of {row_bytes} bytes is not whole blocks")
    flat = blocks.reshape(rows * (row_bytes // nbytes), nbytes)
    return _DECODERS[qtype](flat).reshape(rows, row_bytes // nbytes * values)
