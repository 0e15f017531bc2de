"""GGUF quantized weights kept as stored, and the products computed from them.

`QuantizedMatrix` holds a tensor's raw GGUF rows (uint8, rows x bytes per row): on the CPU the
file's memory map itself, on CUDA a copy of the same bytes, so a q4_k_m file takes its own
size where its f16 copy took 3.5x that. Every tensor keeps its own type (a q4_k_m file mixes
Q4_K and Q6_K tensors).

`QuantizedProducts` computes x @ W^T from it, by one of two kernel sets (option
`quant_kernels`):
- "triton" (CUDA; or the CPU under TRITON_INTERPRET=1, for tests): up to QMV_MAX_ROWS rows of
  x (a decode step, the Fast-AR, the logits) go through a fused dequantizing GEMV that reads
  the blocks once; more rows (a prefill) dequantize W into a reused buffer of the compute type,
  a slab of rows at a time, for cuBLAS;
- "torch" (the CPU; CUDA without Triton): every product dequantizes W with torch ops
  (dequant.py), a slab of rows at a time into the reused buffer, then multiplies. On the CPU
  the buffer is float32 (the exact weights), so products are float32.
The buffer holds at most SLAB_ELEMENTS values (32 MB in float32): a working buffer next to
the weights, not a copy of them. Embedding lookups decode only the rows they gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from . import dequant

#: values per slab of W dequantized into the reused buffer
SLAB_ELEMENTS = 1 << 23
#: rows of x up to which the Triton path multiplies straight from the blocks (fused GEMV)
QMV_MAX_ROWS = 4


@dataclass(frozen=True)
class QuantizedMatrix:
    """A weight [out, in] as its GGUF blocks: `blocks` uint8 (out, bytes per row)."""

    blocks: torch.Tensor
    qtype: QT
    shape: tuple[int, int]

    @property
    def type_name(self) -> str:
        return self.qtype.name.lower()

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 rows `ids` (any shape) -> ids.shape + (in,); only those rows are decoded."""
        flat = ids.reshape(-1)
        return dequant.dequantize(self.blocks[flat], self.qtype).reshape(*ids.shape, self.shape[1])


class SlabBuffer:
    """One flat buffer, reused for every slab of every product (grown once to the largest)."""

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.dtype, self.device = dtype, device
        self._flat: torch.Tensor | None = None

    def __call__(self, rows: int, cols: int) -> torch.Tensor:
        n = rows * cols
        if self._flat is None or self._flat.numel() < n:
            self._flat = None  # free the old one first
            self._flat = torch.empty(n, dtype=self.dtype, device=self.device)
        return self._flat[:n].view(rows, cols)


def slabs(n_rows: int, n_cols: int):
    """(start, stop) row ranges of at most SLAB_ELEMENTS values each."""
    step = max(1, SLAB_ELEMENTS // n_cols)
    for start in range(0, n_rows, step):
        yield start, min(start + step, n_rows)


class QuantizedProducts:
    """x @ W^T for QuantizedMatrix weights, with the activation type of the device.

    On CUDA the activations take the compute dtype (as for every other weight there) and the
    result is in that type (float32 when asked, for logits); on the CPU everything is float32.
    """

    def __init__(self, device: torch.device, compute_dtype: torch.dtype, kernels: str):
        self.on_cuda = device.type == "cuda"
        self.activation_dtype = compute_dtype if self.on_cuda else torch.float32
        self.kernels = kernels
        self.buffer = SlabBuffer(self.activation_dtype, device)
        self._triton = None
        if kernels == "triton":
            from . import triton_kernels  # imports triton: only when this path is chosen
            self._triton = triton_kernels

    def __call__(self, x: torch.Tensor, w: QuantizedMatrix,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
        out_dtype = out_dtype or self.activation_dtype
        x = x.to(self.activation_dtype)
        if self._triton is not None and x.shape[0] <= QMV_MAX_ROWS:
            return self._triton.qmv(x, w.blocks, w.qtype, out_dtype)
        n_out, n_in = w.shape
        out = torch.empty((x.shape[0], n_out), dtype=out_dtype, device=x.device)
        for start, stop in slabs(n_out, n_in):
            weights = self.dequantize(w, start, stop)
            out[:, start:stop] = F.linear(x, weights)
        return out

    def dequantize(self, w: QuantizedMatrix, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of W in the activation type, in the reused buffer."""
        slab = self.buffer(stop - start, w.shape[1])
        if self._triton is not None:
            return self._triton.dequantize_into(w.blocks[start:stop], w.qtype, slab)
        return slab.copy_(dequant.dequantize(w.blocks[start:stop], w.qtype))
