"""One transformer block on torch (SPEC 2.5), shared by the Slow-AR, the Fast-AR and the
several-sequence path (slots.py): the QKV projection and the block's second half; and the
Slow-AR's input embedding of a batch of token rows."""

from __future__ import annotations

import torch

from s2core.plugin import BlockWeights, EvalBatch, StackShape

from . import ops


def project_qkv(x: torch.Tensor, blk: BlockWeights, s: StackShape, rotations: torch.Tensor,
                mm: ops.Matmul) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (n, n_head, d) and k (n, n_head_kv, d), QK-normed and rotated in float32; v as the
    product left it (the compute precision)."""
    qkv = mm(ops.rms_norm(x, blk.attn_norm, s.eps), blk.wqkv)
    q_size, kv_size = s.q_size, s.kv_size
    q = qkv[:, :q_size].unflatten(1, (s.n_head, s.head_dim))
    k = qkv[:, q_size:q_size + kv_size].unflatten(1, (s.n_head_kv, s.head_dim))
    v = qkv[:, q_size + kv_size:].unflatten(1, (s.n_head_kv, s.head_dim))
    if blk.q_norm is not None:
        q = ops.rms_norm(q, blk.q_norm, s.eps)
        k = ops.rms_norm(k, blk.k_norm, s.eps)
    return ops.apply_rope(q, rotations), ops.apply_rope(k, rotations), v


def finish_block(x: torch.Tensor, attn: torch.Tensor, blk: BlockWeights, eps: float,
                 mm: ops.Matmul) -> torch.Tensor:
    """Output projection, residual, SwiGLU feed-forward, residual (the residual in float32)."""
    h = x + mm(attn, blk.wo)
    f = ops.rms_norm(h, blk.ffn_norm, eps)
    return h + mm(ops.silu_gate(mm(f, blk.w1), mm(f, blk.w3)), blk.w2)


def embed(embeddings, codebooks, batch: EvalBatch, device: torch.device) -> torch.Tensor:
    """SPEC 2.4 for every position, float32 (n, dim). One host-to-device copy per array."""
    token_ids = torch.from_numpy(batch.token_ids).to(device)
    codebook_ids = torch.from_numpy(batch.codebook_ids).to(device)
    mask = torch.from_numpy(batch.semantic_mask).to(device)
    scale = torch.from_numpy(batch.scale).to(device)
    x = ops.gather(embeddings, token_ids)
    # Text positions gather codebook row 0 (the core points them there) and mask it out.
    codes = ops.gather(codebooks, codebook_ids).sum(dim=1)
    return (x + mask[:, None] * codes) * scale[:, None]
