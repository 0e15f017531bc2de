"""Numpy quantizer for the GGML K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K).

Why this exists: ``gguf.quants`` (gguf-py) can *dequantize* every K-quant but
can only *quantize* F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1.  Our test-model writer
needs real K-quant tensors, so this module produces byte-exact GGML blocks
that ``gguf.GGUFWriter.add_tensor(..., raw_dtype=qtype)`` accepts and that
``gguf.quants.dequantize(blocks, qtype)`` decodes.

The block layouts mirror the ``Q2_K`` .. ``Q6_K`` classes of
``gguf/quants.py`` (itself a port of ggml's ``block_q*_K`` structs).  The
quantization scheme is simpler than llama.cpp's (no importance weights), but
sound:

1. fit a scale (and for Q2_K/Q4_K/Q5_K a min) per sub-block, trying a few
   candidate scales followed by a least-squares refit and keeping the best;
2. quantize the sub-block scales/mins against the fp16 super-block
   ``d``/``dmin`` (4, 6 or 8 bits depending on the type);
3. round the values with the *quantized* scales, so the only error left is
   that of the final decoded format.

Limits of the formats themselves: the super-block scales are fp16, so very
large data saturates (e.g. |x| above ~2.9e6 for Q2_K, ~6e7 for Q4_K) and very
small data (std below ~1e-4) gets coarser scales (fp16 subnormals).

Everything is vectorized over blocks; the only Python loops are over a few
candidate scales and over large chunks of blocks (to bound memory use).
"""

from __future__ import annotations

import numpy as np

import gguf

QK_K = 256  # values per K-quant super-block

_T = gguf.GGMLQuantizationType

# Candidate offsets added to the number of quantization steps when searching
# a sub-block's scale (like llama.cpp's rmin/rdelta/nstep search, coarser).
_AFFINE_DELTAS = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)
_SYMMETRIC_DELTAS = (-0.6, -0.3, 0.0, 0.3, 0.6, 0.9)

# Blocks processed per chunk: keeps temporaries around 10-30 MB.
_CHUNK_BLOCKS = 4096


# ---------------------------------------------------------------------------
# small numeric helpers
# ---------------------------------------------------------------------------

_F16_MAX = float(np.finfo(np.float16).max)


def _f16_away(x: np.ndarray) -> np.ndarray:
    """Round to fp16 away from zero (saturating at +-65504); returns float16.

    Used for the super-block scales d/dmin: rounding them *up* in magnitude
    guarantees s / d never exceeds the integer range of the sub-block scales
    (no clipping), and a tiny non-zero d becomes the smallest fp16 subnormal
    instead of underflowing to 0.
    """
    x = np.clip(x, -_F16_MAX, _F16_MAX).astype(np.float32)
    h = x.astype(np.float16)
    # (a shortfall within float32 round-off, e.g. when requantizing already
    # quantized data, is harmless: s / d still rounds to the largest level)
    short = np.abs(h.astype(np.float32)) * np.float32(1 + 2**-12) < np.abs(x)
    with np.errstate(over="ignore"):  # nextafter(65504, inf) is computed, never used
        away = np.nextafter(h, np.copysign(np.float16(np.inf), h))
    return np.where(short, away, h)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    """(nb,) or (nb, 1) fp16 values -> (nb, 2) little-endian bytes."""
    return np.ascontiguousarray(x.astype("<f2")).reshape(-1, 1).view(np.uint8)


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, with 0 where den == 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / den, np.float32(0)).astype(np.float32)


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    """Value of largest magnitude along the last axis, keeping its sign."""
    idx = np.abs(x).argmax(axis=-1)[..., None]
    return np.take_along_axis(x, idx, axis=-1)[..., 0]


# ---------------------------------------------------------------------------
# per-sub-block scale fitting
# ---------------------------------------------------------------------------

def _fit_affine(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Fit x ~= scale * L - minv with integer L in [0, nmax].

    x: (nb, nsub, sublen).  Returns (scale, minv), both >= 0, shape (nb, nsub).
    GGML stores the min as a non-negative number that is subtracted, so the
    offset is clamped to <= 0 (as llama.cpp's make_qkx2_quants does).
    """
    n = x.shape[-1]
    lo = np.minimum(x.min(axis=-1), 0)
    rng = x.max(axis=-1) - lo
    inv_rng = _safe_div(np.float32(1), rng)
    sx = x.sum(axis=-1)

    best_scale = rng / nmax
    best_off = lo
    best_err = np.full(lo.shape, np.inf, dtype=np.float32)

    with np.errstate(divide="ignore", invalid="ignore"):
        for delta in _AFFINE_DELTAS:
            iscale = (nmax + delta) * inv_rng
            L = np.clip(np.rint((x - lo[..., None]) * iscale[..., None]), 0, nmax)
            sl = L.sum(axis=-1)
            sl2 = (L * L).sum(axis=-1)
            sxl = (x * L).sum(axis=-1)
            # least squares for (scale, off) in x ~= scale * L + off
            det = n * sl2 - sl * sl
            scale = (n * sxl - sl * sx) / det
            off = (sl2 * sx - sl * sxl) / det
            # off must be <= 0: otherwise refit the scale alone with off = 0
            pos = off > 0
            scale = np.where(pos, sxl / sl2, scale)
            off = np.where(pos, np.float32(0), off)
            ok = (det > 0) & (scale > 0) & np.isfinite(scale) & np.isfinite(off)
            err = np.square(scale[..., None] * L + off[..., None] - x).sum(axis=-1)
            better = ok & (err < best_err)
            best_scale = np.where(better, scale, best_scale)
            best_off = np.where(better, off, best_off)
            best_err = np.where(better, err, best_err)

    return best_scale.astype(np.float32), (-best_off).astype(np.float32)


def _fit_symmetric(x: np.ndarray, nmax: int) -> np.ndarray:
    """Fit x ~= scale * L with integer L in [-nmax, nmax - 1].

    x: (nb, nsub, sublen).  Returns the signed scale, shape (nb, nsub).  As in
    ggml, the scale's sign is chosen so the value of largest magnitude maps to
    -nmax, which uses the extra negative level.
    """
    amax = _signed_absmax(x)
    inv_amax = _safe_div(np.float32(1), amax)
    best_scale = amax / -nmax
    best_score = np.full(amax.shape, -np.inf, dtype=np.float32)

    with np.errstate(divide="ignore", invalid="ignore"):
        for delta in _SYMMETRIC_DELTAS:
            iscale = -(nmax + delta) * inv_amax
            L = np.clip(np.rint(x * iscale[..., None]), -nmax, nmax - 1)
            sxl = (x * L).sum(axis=-1)
            sl2 = (L * L).sum(axis=-1)
            # least-squares scale sxl/sl2 leaves error sum(x^2) - sxl^2/sl2,
            # so the best candidate maximizes sxl^2/sl2
            score = sxl * sxl / sl2
            ok = sl2 > 0
            better = ok & (score > best_score)
            best_scale = np.where(better, sxl / sl2, best_scale)
            best_score = np.where(better, score, best_score)

    return best_scale.astype(np.float32)


# ---------------------------------------------------------------------------
# super-block quantization of the sub-block scales
# ---------------------------------------------------------------------------

def _quantize_unsigned_scales(s: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """s >= 0, (nb, nsub) -> (d fp16 (nb,), q uint8 (nb, nsub)) with s ~= d * q."""
    d = _f16_away(s.max(axis=-1) / qmax)
    q = np.clip(np.rint(_safe_div(s, d.astype(np.float32)[:, None])), 0, qmax)
    return d, q.astype(np.uint8)


def _quantize_signed_scales(s: np.ndarray, qneg: int) -> tuple[np.ndarray, np.ndarray]:
    """signed s, (nb, nsub) -> (d fp16 (nb,), q int in [-qneg, qneg-1]), s ~= d * q."""
    d = _f16_away(_signed_absmax(s) / -qneg)
    q = np.clip(np.rint(_safe_div(s, d.astype(np.float32)[:, None])), -qneg, qneg - 1)
    return d, q.astype(np.int16)


def _round_affine(x, d, sc, dmin, m, nmax):
    """Round x (nb, nsub, sublen) with the decoded scales d*sc and mins dmin*m."""
    scale = d.astype(np.float32)[:, None] * sc.astype(np.float32)
    minv = dmin.astype(np.float32)[:, None] * m.astype(np.float32)
    inv = _safe_div(np.float32(1), scale)
    q = np.rint((x + minv[..., None]) * inv[..., None])
    return np.clip(q, 0, nmax).astype(np.uint8)


def _round_symmetric(x, d, sc, nmax):
    """Round x (nb, nsub, sublen) with the decoded scales d*sc; L in [-nmax, nmax-1]."""
    scale = d.astype(np.float32)[:, None] * sc.astype(np.float32)
    inv = _safe_div(np.float32(1), scale)
    q = np.rint(x * inv[..., None])
    return np.clip(q, -nmax, nmax - 1).astype(np.int16)


# ---------------------------------------------------------------------------
# bit packing helpers
# ---------------------------------------------------------------------------

def _pack_bits(q: np.ndarray, bits: int) -> np.ndarray:
    """OR together the planes q[..., j, :] << (bits * j) along axis -2."""
    out = np.zeros(q.shape[:-2] + q.shape[-1:], dtype=np.uint8)
    for j in range(q.shape[-2]):
        out |= (q[..., j, :].astype(np.uint8) << np.uint8(bits * j))
    return out


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Pack 8 six-bit scales and 8 six-bit mins into the 12 bytes of Q4_K/Q5_K.

    Layout (see Q4_K.get_scale_min), upper case = scales, lower case = mins,
    sub-blocks a..h = 0..7:
         0 EEAAAAAA    4 eeaaaaaa    8 eeeeEEEE
         1 FFBBBBBB    5 ffbbbbbb    9 ffffFFFF
         2 GGCCCCCC    6 ggcccccc   10 ggggGGGG
         3 HHDDDDDD    7 hhdddddd   11 hhhhHHHH
    i.e. sub-blocks 0-3 are stored whole in the low 6 bits of bytes 0-7, and
    sub-blocks 4-7 are split: low 4 bits in bytes 8-11, high 2 bits in the
    top bits of bytes 0-7.
    """
    lo_sc, hi_sc = sc[:, :4], sc[:, 4:]
    lo_m, hi_m = m[:, :4], m[:, 4:]
    b0 = lo_sc | ((hi_sc >> 4) << 6)
    b4 = lo_m | ((hi_m >> 4) << 6)
    b8 = (hi_sc & 0x0F) | ((hi_m & 0x0F) << 4)
    return np.concatenate([b0, b4, b8], axis=-1).astype(np.uint8)


def _pack_nibbles_32(q: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K low nibbles: (nb, 8, 32) values -> (nb, 128) bytes.

    Sub-blocks 2c and 2c+1 share bytes 32c..32c+31 (low / high nibble).
    """
    nb = q.shape[0]
    lo = (q & 0x0F).reshape(nb, 4, 2, 32)
    return _pack_bits(lo, 4).reshape(nb, 128)


# ---------------------------------------------------------------------------
# per-type block quantizers: (nb, 256) float32 -> (nb, type_size) uint8
# ---------------------------------------------------------------------------

def _q2_k(x: np.ndarray) -> np.ndarray:
    # block_q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
    # value = d * sc * q - dmin * m, q in [0, 3], 16 sub-blocks of 16
    nb = x.shape[0]
    xs = x.reshape(nb, 16, 16)
    scale, minv = _fit_affine(xs, 3)
    d, sc = _quantize_unsigned_scales(scale, 15)
    dmin, m = _quantize_unsigned_scales(minv, 15)
    q = _round_affine(xs, d, sc, dmin, m, 3).reshape(nb, 2, 4, 32)
    # element 128c + 32j + l lives in qs[32c + l], bits 2j..2j+1
    qs = _pack_bits(q, 2).reshape(nb, 64)
    scales = sc | (m << 4)
    return np.concatenate([scales, qs, _f16_bytes(d), _f16_bytes(dmin)], axis=-1)


def _q3_k(x: np.ndarray) -> np.ndarray:
    # block_q3_K: hmask[32], qs[64], scales[12], d
    # value = d * (s - 32) * q, q in [-4, 3], 16 sub-blocks of 16
    nb = x.shape[0]
    xs = x.reshape(nb, 16, 16)
    d, sc = _quantize_signed_scales(_fit_symmetric(xs, 4), 32)
    u = (_round_symmetric(xs, d, sc, 4) + 4).astype(np.uint8).reshape(nb, 256)  # 0..7
    # low 2 bits: element 128c + 32j + l in qs[32c + l], bits 2j..2j+1
    qs = _pack_bits((u & 3).reshape(nb, 2, 4, 32), 2).reshape(nb, 64)
    # high bit: element 32j + l in hmask[l], bit j (set means "no -4 offset")
    hmask = _pack_bits((u >> 2).reshape(nb, 8, 32), 1)
    # 16 six-bit scales s + 32: low nibbles of s[0..7] / s[8..15] in the
    # low / high nibbles of bytes 0-7; high 2 bits of s[4j + k] in byte 8 + k,
    # bits 2j..2j+1
    s = (sc + 32).astype(np.uint8)
    low = (s[:, :8] & 0x0F) | ((s[:, 8:] & 0x0F) << 4)
    high = _pack_bits((s >> 4).reshape(nb, 4, 4), 2)
    return np.concatenate([hmask, qs, low, high, _f16_bytes(d)], axis=-1)


def _q4_k(x: np.ndarray) -> np.ndarray:
    # block_q4_K: d, dmin, scales[12], qs[128]
    # value = d * sc * q - dmin * m, q in [0, 15], 8 sub-blocks of 32
    nb = x.shape[0]
    xs = x.reshape(nb, 8, 32)
    scale, minv = _fit_affine(xs, 15)
    d, sc = _quantize_unsigned_scales(scale, 63)
    dmin, m = _quantize_unsigned_scales(minv, 63)
    q = _round_affine(xs, d, sc, dmin, m, 15)
    return np.concatenate(
        [_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, m), _pack_nibbles_32(q)],
        axis=-1,
    )


def _q5_k(x: np.ndarray) -> np.ndarray:
    # block_q5_K: d, dmin, scales[12], qh[32], qs[128]
    # value = d * sc * q - dmin * m, q in [0, 31], 8 sub-blocks of 32
    nb = x.shape[0]
    xs = x.reshape(nb, 8, 32)
    scale, minv = _fit_affine(xs, 31)
    d, sc = _quantize_unsigned_scales(scale, 63)
    dmin, m = _quantize_unsigned_scales(minv, 63)
    q = _round_affine(xs, d, sc, dmin, m, 31)
    # 5th bit: element 32j + l (sub-block j) in qh[l], bit j
    qh = _pack_bits(q >> 4, 1)
    return np.concatenate(
        [_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, m), qh, _pack_nibbles_32(q)],
        axis=-1,
    )


def _q6_k(x: np.ndarray) -> np.ndarray:
    # block_q6_K: ql[128], qh[64], scales[16] (int8), d
    # value = d * sc * (q - 32), q - 32 in [-32, 31], 16 sub-blocks of 16
    nb = x.shape[0]
    xs = x.reshape(nb, 16, 16)
    d, sc = _quantize_signed_scales(_fit_symmetric(xs, 32), 128)
    u = (_round_symmetric(xs, d, sc, 32) + 32).astype(np.uint8)  # 0..63
    # low 4 bits: element 128c + 64h + l in ql[64c + l], nibble h
    ql = _pack_bits((u & 0x0F).reshape(nb, 2, 2, 64), 4).reshape(nb, 128)
    # high 2 bits: element 128c + 32j + l in qh[32c + l], bits 2j..2j+1
    qh = _pack_bits((u >> 4).reshape(nb, 2, 4, 32), 2).reshape(nb, 64)
    scales = sc.astype(np.int8).view(np.uint8)
    return np.concatenate([ql, qh, scales, _f16_bytes(d)], axis=-1)


_QUANTIZERS = {
    _T.Q2_K: _q2_k,
    _T.Q3_K: _q3_k,
    _T.Q4_K: _q4_k,
    _T.Q5_K: _q5_k,
    _T.Q6_K: _q6_k,
}

SUPPORTED_TYPES = tuple(_QUANTIZERS)


def quantize_k(data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """Quantize float data of shape (..., n), n % 256 == 0, to a GGML K-quant.

    Returns a uint8 array of shape (..., n // 256 * type_size): the raw blocks
    expected by ``GGUFWriter.add_tensor(..., raw_dtype=qtype)`` and decoded by
    ``gguf.quants.dequantize(result, qtype)`` back to shape (..., n).
    """
    try:
        qtype = _T(qtype)
        quantizer = _QUANTIZERS[qtype]
    except (ValueError, KeyError):
        names = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise ValueError(f"quantize_k: unsupported type {qtype!r}; supported: {names}") from None

    x = np.asarray(data, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % QK_K != 0:
        n = x.shape[-1] if x.ndim else None
        raise ValueError(
            f"quantize_k: last dimension ({n}) must be a multiple of {QK_K} for {qtype.name}"
        )
    if not np.isfinite(x).all():
        raise ValueError("quantize_k: data contains NaN or infinite values")

    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    assert block_size == QK_K
    blocks = x.reshape(-1, QK_K)
    out = np.empty((blocks.shape[0], type_size), dtype=np.uint8)
    for start in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        chunk = blocks[start:start + _CHUNK_BLOCKS]
        out[start:start + chunk.shape[0]] = quantizer(chunk)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * type_size)
