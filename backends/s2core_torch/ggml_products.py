"""Products in s2.cpp's arithmetic (`arithmetic="ggml"`) for weights kept as stored.

Each product quantizes its activation rows to the weight type's dot type first, as ggml does
(triton_ggml.py), then:
- Q8_0, Q4_K, Q6_K weights (q8_0 and q4_k_m files): integer block dots (triton_ggml.int_dot),
  every row count alike, so a row's numbers never depend on the rows beside it;
- the other quantized types: the activation's block values d * code through the float kernels
  (quantized.QuantizedProducts with Triton's kernels), plus, for Q4_1/Q5_1, the one term of
  Q8_1 that is not such a product (its float16 s times the weight block's min).
Half weights (F16/BF16) take the activation rounded to their type (ops.Matmul). Not covered:
a quantized tensor with an infinite or NaN scale, widened on load (weights.py), loses its type
and multiplies float32 activations (NumPy's backend still rounds those).

Needs Triton's kernels: CUDA, or the CPU under TRITON_INTERPRET=1 (the tests).
"""

from __future__ import annotations

import torch

from .quantized import QuantizedMatrix, QuantizedProducts


class GgmlProducts:
    """x @ W^T for QuantizedMatrix weights in ggml's arithmetic; float32 in, float32 out
    (or `out_dtype`)."""

    kernels = "triton"

    def __init__(self, device: torch.device):
        from . import triton_ggml  # imports triton: only when this arithmetic is chosen
        self._ggml = triton_ggml
        self.floats = QuantizedProducts(device, torch.float32, "triton")

    def __call__(self, x: torch.Tensor, w: QuantizedMatrix,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
        g = self._ggml
        out_dtype = out_dtype or torch.float32
        x = x.to(torch.float32)
        if w.qtype in g.INTEGER_TYPES:
            return g.int_dot(x, w.blocks, w.qtype, out_dtype)
        dot_type = g.DOT_TYPE[w.qtype]
        out = self.floats(g.snapped(dot_type, x), w, torch.float32)
        if dot_type == "q8_1":
            out += g.q8_1_s_error(x) @ g.block_mins(w.blocks, w.qtype).T
        return out.to(out_dtype)
