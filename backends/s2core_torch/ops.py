"""The transformer's building blocks as torch code on fused primitives.

Precision plan (s2.cpp's): the residual stream, norms, RoPE, softmax and the logits stay in
float32; only the activations fed to matrix products take the compute precision.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .quantized import QuantizedMatrix, QuantizedProducts

HALF = (torch.float16, torch.bfloat16)

#: On the CPU, products of at most this many rows with an f16/bf16 weight run in the weight's
#: type: torch's half GEMV streams the weight at memory speed, and for a few rows (it then runs
#: about one GEMV per row out of cache) it still beats widening the weight. Measured on a Zen4
#: for 9728x2560 weights read from DRAM: f16 1.7 ms at 1 row, 11 at 8, 20 at 16, 40 at 32;
#: widen + f32 GEMM 19-25 ms from 1 to 16 rows, 34 at 32. Above it the weight is widened to
#: float32 at use: torch's f16 GEMM has no fast CPU kernel (44 vs 135 GFLOP/s for f32).
CPU_HALF_MAX_ROWS = 16


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, in float32."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight, eps)


def rope_table(n_positions: int, head_dim: int, base: float, device: torch.device) -> torch.Tensor:
    """Unit rotations (n_positions, head_dim/2), complex64: angle = position * base^(-2i/d).

    Angles are formed in float64 so long contexts keep their precision, then cast."""
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(n_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    table = torch.complex(torch.from_numpy(np.cos(angles).astype(np.float32)),
                          torch.from_numpy(np.sin(angles).astype(np.float32)))
    return table.to(device)


def apply_rope(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Rotate ADJACENT pairs (x[2i], x[2i+1]) (ggml mode 0, not rotate-half), in float32.

    x: (n, heads, head_dim); rotations: (n, head_dim/2). A pair is one complex number, so the
    rotation is one complex product: (a + ib)(cos + i sin)."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * rotations[:, None, :]).flatten(-2)


def causal_mask(n_queries: int, n_past: int, device: torch.device) -> torch.Tensor | None:
    """(n, n_past + n) booleans: query i, at position n_past + i, sees keys 0..n_past + i.

    None for one query: the last position sees every key."""
    if n_queries == 1:
        return None
    keys = torch.arange(n_past + n_queries, device=device)
    queries = torch.arange(n_past, n_past + n_queries, device=device)
    return keys[None, :] <= queries[:, None]


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Grouped-query attention on SDPA's fused kernels (no repeated K/V is materialized).

    q: (n, n_head, d); keys, values: (n_head_kv, T, d), any row stride. Returns (n, n_head*d).
    One query on the CPU (a decode step, a Fast-AR call) takes `_one_query_attention`.
    """
    n, n_head, d = q.shape
    if n == 1 and mask is None and q.device.type == "cpu":
        return _one_query_attention(q, keys, values, scale)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
        attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(n, n_head * d)


def prefixed_attention(q: torch.Tensor, prefix: tuple[torch.Tensor, torch.Tensor] | None,
                       keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                       scale: float) -> torch.Tensor:
    """`attention` over keys held in two blocks: a shared prefix's (positions [0, p), or None)
    and then the sequence's own (`keys`, `values`: positions p and later); `mask` over all of
    them, as causal_mask gives it.

    One query on the CPU (a decode step) reads both blocks in place: the scores of both go
    into one softmax and each block's V is summed where it lies, so only the order of that
    last sum differs from one block. Elsewhere (prefill, CUDA) the blocks are joined into a
    temporary for the fused kernel, freed after the call: the prefix is still held once."""
    if prefix is None:
        return attention(q, keys, values, mask, scale)
    k_prefix, v_prefix = prefix
    if q.shape[0] == 1 and mask is None and q.device.type == "cpu":
        n_head_kv, p, d = k_prefix.shape
        grouped = q[0].reshape(n_head_kv, -1, d)
        scores = torch.cat([torch.bmm(grouped, k_prefix.transpose(1, 2)),
                            torch.bmm(grouped, keys.transpose(1, 2))], dim=-1)
        weights = torch.softmax(scores.mul_(scale), dim=-1)
        out = torch.bmm(weights[:, :, :p], v_prefix)
        out += torch.bmm(weights[:, :, p:], values)
        return out.reshape(1, -1)
    return attention(q, torch.cat([k_prefix, keys], dim=1), torch.cat([v_prefix, values], dim=1),
                     mask, scale)


def _one_query_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                         scale: float) -> torch.Tensor:
    """Attention of one position as two batched products over the KV heads, each head's
    group of query heads as the rows (ggml's GQA layout).

    torch's CPU flash kernel is tiled for many queries: for one it takes about twice as long
    (Zen4, 2 threads, 32 query / 8 KV heads of 128, f32: 170 against 95 us at 256 positions,
    2.8 against 0.9 ms at 2048), which for S2 Pro's 36 layers is ~70 ms a step at 2048."""
    n_head_kv, _, d = keys.shape
    grouped = q[0].reshape(n_head_kv, -1, d)              # (n_head_kv, group, d)
    scores = torch.bmm(grouped, keys.transpose(1, 2))      # (n_head_kv, group, T)
    weights = torch.softmax(scores.mul_(scale), dim=-1)
    return torch.bmm(weights, values).reshape(1, -1)


class WeightWidener:
    """float32 copies of half weights for multi-row CPU products, made in one reused buffer
    (sized by the largest weight widened so far).

    A fresh 100 MB float32 tensor per product would cost a page fault per 4 KB (glibc maps
    allocations that large anew each time): 28 ms to widen a 9728x2560 weight instead of 4 ms.
    """

    def __init__(self):
        self._buffer: torch.Tensor | None = None

    def __call__(self, w: torch.Tensor) -> torch.Tensor:
        if self._buffer is None or self._buffer.numel() < w.numel():
            self._buffer = None  # free the old one first
            self._buffer = torch.empty(w.numel(), dtype=torch.float32)
        return self._buffer[:w.numel()].view(w.shape).copy_(w)


class Matmul:
    """x @ w.T with the activation precision the device and the row count call for.

    CUDA: activations and weight in the compute dtype (a weight stored otherwise is converted
    at use). CPU: f32 weights in f32; f16/bf16 weights in their own type for up to
    CPU_HALF_MAX_ROWS rows (torch's half GEMV accumulates in f32 but rounds its output to the
    half type), widened to f32 at use above that. Quantized weights kept as stored go to
    `quantized` (quantized.QuantizedProducts, with the kernels named by `quant_kernels`).

    arithmetic "ggml" (s2.cpp's; compute dtype f32): quantized weights go to
    ggml_products.GgmlProducts, and half weights take the activation rounded to their type,
    multiplied in float32 (ggml's F16 dot: f16 operands, f32 sums).
    """

    def __init__(self, device: torch.device, compute_dtype: torch.dtype,
                 quant_kernels: str = "torch", arithmetic: str = "f32"):
        self.on_cuda = device.type == "cuda"
        self.compute_dtype = compute_dtype
        self.ggml = arithmetic == "ggml"
        self.widen = WeightWidener()
        if self.ggml:
            from .ggml_products import GgmlProducts
            self.quantized = GgmlProducts(device)
        else:
            self.quantized = QuantizedProducts(device, compute_dtype, quant_kernels)

    def __call__(self, x: torch.Tensor, w: torch.Tensor | QuantizedMatrix) -> torch.Tensor:
        if isinstance(w, QuantizedMatrix):
            return self.quantized(x, w)
        if self.ggml and w.dtype in HALF:
            wide = w.float() if self.on_cuda else self.widen(w)
            return F.linear(x.to(w.dtype).float(), wide)
        if self.on_cuda:
            return F.linear(x.to(self.compute_dtype), w.to(self.compute_dtype))
        if w.dtype not in HALF:
            return F.linear(x.float(), w)
        if x.shape[0] <= CPU_HALF_MAX_ROWS:
            # one GEMV a row: torch's half kernels for 2+ rows sum in another order on some
            # CPUs (an AVX512-FP16 Xeon: a 9728 x 2560 row 2 f16 ulps off its one-row product),
            # so a batched sequence would get other numbers than alone and greedy codes that
            # flip. It is what torch ran for a few rows on a Zen 4 anyway (see above).
            rows = x.to(w.dtype)
            if rows.shape[0] == 1:
                return F.linear(rows, w)
            return torch.cat([F.linear(row, w) for row in rows.split(1)])
        return F.linear(x.float(), self.widen(w))


class OutputProduct:
    """float32 logits = table @ h for one vector h (tied logits, Fast-AR output).

    On CUDA with half compute it asks cuBLAS for float32 output (aten mm.dtype) so the logits
    are not rounded to the half type; that op has no CPU kernel (torch 2.13), so the CPU half
    GEMV's output is rounded to f16/bf16 before the cast (relative error ~2e-4 for f16).
    """

    def __init__(self, matmul: Matmul, device: torch.device):
        self.matmul = matmul
        self.f32_output = matmul.on_cuda and matmul.compute_dtype in HALF and _mm_dtype_works(
            matmul.compute_dtype, device)

    def __call__(self, table: torch.Tensor | QuantizedMatrix, h: torch.Tensor) -> torch.Tensor:
        if isinstance(table, QuantizedMatrix):  # float32 out of the kernel itself
            return self.matmul.quantized(h[None], table, out_dtype=torch.float32)[0]
        if self.f32_output:
            dtype = self.matmul.compute_dtype
            return torch.ops.aten.mm.dtype(h.to(dtype)[None], table.to(dtype).t(), torch.float32)[0]
        return self.matmul(h[None], table)[0].float()

    def rows(self, table: torch.Tensor | QuantizedMatrix, h: torch.Tensor) -> torch.Tensor:
        """The same for B vectors at once, h (B, in) -> (B, out): one read of the table."""
        if isinstance(table, QuantizedMatrix):
            return self.matmul.quantized(h, table, out_dtype=torch.float32)
        if self.f32_output:
            dtype = self.matmul.compute_dtype
            return torch.ops.aten.mm.dtype(h.to(dtype), table.to(dtype).t(), torch.float32)
        return self.matmul(h, table).float()


def _mm_dtype_works(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether this torch build has aten::mm.dtype (half inputs, float32 output) on CUDA."""
    try:
        a = torch.ones(1, 8, dtype=dtype, device=device)
        return torch.ops.aten.mm.dtype(a, a.t(), torch.float32).dtype == torch.float32
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def gather(table: torch.Tensor | QuantizedMatrix, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of a lookup table as float32, ids.shape + (in,); a quantized table decodes
    only those rows."""
    if isinstance(table, QuantizedMatrix):
        return table.rows(ids)
    return table[ids].float()


def silu_gate(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's silu(gate) * up, in the products' output type."""
    return F.silu(gate) * up
