"""One transformer block in MLX (SPEC 2.5), shared by the Slow-AR and the Fast-AR.

Activations are float32 and laid out for MLX's fused kernels: per-head tensors are
(B, heads, tokens, head_dim), the shape mx.fast.rope and mx.fast.scaled_dot_product_attention
expect: B = 1 for a sequence's positions (the Slow-AR, per slot), B sequences of one position
each for the batched Fast-AR.
"""

from __future__ import annotations

import threading

import mlx.core as mx
from s2core.plugin import StackShape
from s2core.plugin import BlockWeights



def attention_inputs(x: mx.array, blk: BlockWeights, s: StackShape, first_position: int
                     ) -> tuple[mx.array, mx.array, mx.array]:
    """q (1, n_head, n, d) and k, v (1, n_head_kv, n, d) of the n rows of x, which sit at
    positions first_position.., QK-normed and rotated."""
    return sequence_heads(project_qkv(x, blk, s), blk, s, first_position)


def project_qkv(x: mx.array, blk: BlockWeights, s: StackShape) -> mx.array:
    """The fused QKV product of every row of x (n, q_size + 2 kv_size): one weight read for
    all rows, whichever sequences they belong to."""
    return blk.wqkv.project(mx.fast.rms_norm(x, blk.attn_norm, s.eps))


def split_heads(qkv: mx.array, blk: BlockWeights, s: StackShape
                ) -> tuple[mx.array, mx.array, mx.array]:
    """q (n, n_head, d) and k, v (n, n_head_kv, d) of qkv's rows, q and k QK-normed."""
    n = qkv.shape[0]
    q = qkv[:, :s.q_size].reshape(n, s.n_head, s.head_dim)
    k = qkv[:, s.q_size:s.q_size + s.kv_size].reshape(n, s.n_head_kv, s.head_dim)
    v = qkv[:, s.q_size + s.kv_size:].reshape(n, s.n_head_kv, s.head_dim)
    if blk.q_norm is not None:
        q = mx.fast.rms_norm(q, blk.q_norm, s.eps)
        k = mx.fast.rms_norm(k, blk.k_norm, s.eps)
    return q, k, v


def rotate(t: mx.array, s: StackShape, first_position: int) -> mx.array:
    """RoPE over (B, heads, T, d), position first_position + t along T. traditional=True
    rotates adjacent pairs (x[2i], x[2i+1]): ggml's mode 0 (SPEC 2.5)."""
    return mx.fast.rope(t, s.head_dim, traditional=True, base=s.rope_base, scale=1.0,
                        offset=first_position)


def sequence_heads(qkv: mx.array, blk: BlockWeights, s: StackShape, first_position: int
                   ) -> tuple[mx.array, mx.array, mx.array]:
    """qkv's rows as the positions first_position.. of ONE sequence: q (1, n_head, n, d),
    k and v (1, n_head_kv, n, d), rotated."""
    q, k, v = (t.transpose(1, 0, 2)[None] for t in split_heads(qkv, blk, s))
    return rotate(q, s, first_position), rotate(k, s, first_position), v


def attend(q: mx.array, keys: mx.array, values: mx.array, s: StackShape) -> mx.array:
    """Causal grouped-query attention of queries at the END of the key range: query i of n
    sees keys 0..T-n+i, which is MLX's lower-right-aligned "causal" mask (query head h reads
    KV head h // (n_head / n_head_kv), without repeating K/V). q (B, n_head, n, d) against
    keys, values (B, n_head_kv, T, d); returns the B*n rows (B*n, n_head * d)."""
    n = q.shape[2]
    out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=s.attn_scale,
                                               mask="causal" if n > 1 else None)
    return out.transpose(0, 2, 1, 3).reshape(-1, s.q_size)


# SwiGLU's three element-wise ops fused into one kernel. shapeless: traced once, reused for
# every row count (no retrace per prompt length). Bit-identical to the plain ops; a step of
# the small demo model 6.3 against 7.0 ms on this CPU, no difference on S2 Pro-sized layers,
# where the products dominate (README, "Compute").
_swiglu_compiled = mx.compile(lambda gate, up: gate * mx.sigmoid(gate) * up, shapeless=True)


def _swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """The compiled kernel on the main thread only: a compiled function traces on the calling
    thread's default stream, which MLX then creates for that thread, and a thread that leaves
    one behind aborts the process at exit. Other threads get the same bits from the plain ops."""
    if threading.current_thread() is threading.main_thread():
        return _swiglu_compiled(gate, up)
    return gate * mx.sigmoid(gate) * up


def finish_block(x: mx.array, attn: mx.array, blk: BlockWeights, eps: float) -> mx.array:
    """Output projection, residual, SwiGLU feed-forward, residual."""
    h = x + blk.wo.project(attn)
    f = mx.fast.rms_norm(h, blk.ffn_norm, eps)
    return h + blk.w2.project(_swiglu(blk.w1.project(f), blk.w3.project(f)))
