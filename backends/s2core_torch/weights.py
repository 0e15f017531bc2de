"""Model tensors as torch tensors on the backend's device, one tensor at a time.

F32, F16 and BF16 tensors keep their stored type. On the CPU they are the memory-mapped file
itself (no copy: the page cache holds the weights once, shared with every process that maps the
file). Quantized tensors are either kept as stored (`keep_quantized`, the option
quantized="stored": a `QuantizedMatrix` of their raw blocks, on the CPU again the map itself)
or dequantized on load, a slab of rows at a time so that not even one whole tensor sits in
float32 on the host, into `widened_dtype` (f16 on the CPU, the compute dtype on CUDA). A
quantized tensor with an infinite or NaN scale is widened even when kept as stored, with a
warning (s2core.gguf.blocks says why).

Every tensor the backend holds as a copy (widened on the CPU, anything on CUDA) has its file
pages released once copied (`ModelFile.release`): reading it faulted them into this process, and
they would otherwise stay resident beside the copy (a q8_0 file would count 1.4 GB on top of its
2.7 GB of f16 copies). Tensors used in place from the map are never released.
"""

from __future__ import annotations

import warnings
from typing import Union

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from s2core.plugin import QUANTIZED_TYPES, NonFiniteScalesWarning, non_finite_scale_blocks
from s2core.plugin import ModelFile

from .quantized import QuantizedMatrix

#: float32 elements decoded per slab of a quantized tensor (64 MB)
_SLAB_ELEMENTS = 16 * 1024 * 1024

#: a matrix as the backend holds it
Matrix = Union[torch.Tensor, QuantizedMatrix]


class WeightLoader:
    def __init__(self, model_file: ModelFile, device: torch.device, widened_dtype: torch.dtype,
                 keep_quantized: bool = False):
        self.model_file = model_file
        self.device = device
        self.widened_dtype = widened_dtype
        self.keep_quantized = keep_quantized
        #: quantized tensors widened although keep_quantized (non-finite scales)
        self.widened_non_finite: list[str] = []

    def matrix(self, name: str) -> Matrix:
        """A 2-D weight [out, in]: as stored if F32/F16/BF16 (or quantized and kept as
        stored), else widened."""
        info = self.model_file.info(name)
        if info.type in (QT.F32, QT.F16, QT.BF16):
            out = self._stored(name, info.type).to(self.device)  # a no-op on the CPU
        elif self.keep_quantized and info.type in QUANTIZED_TYPES and self._finite(name, info.type):
            blocks = self._release_copied(name, self._stored(name, info.type).to(self.device))
            return QuantizedMatrix(blocks, info.type, info.shape)
        else:
            out = self._dequantized(name, info.shape)
        return self._release_copied(name, out)

    def _finite(self, name: str, qtype: QT) -> bool:
        bad = non_finite_scale_blocks(self.model_file.raw(name), qtype)
        if bad:
            self.widened_non_finite.append(name)
            warnings.warn(f"{name} ({qtype.name}): {bad} block(s) with an infinite or NaN scale; "
                          f"widened to {self.widened_dtype} as gguf decodes it instead of kept "
                          "as stored", NonFiniteScalesWarning, stacklevel=3)
        return not bad

    def vector(self, name: str) -> torch.Tensor:
        """A 1-D weight (norm gains) as float32: norms are computed in float32."""
        info = self.model_file.info(name)
        if info.type in (QT.F32, QT.F16, QT.BF16):
            out = self._stored(name, info.type).to(self.device, torch.float32)
        else:
            out = torch.from_numpy(self.model_file.dequantize(name)).to(self.device)
        return self._release_copied(name, out)

    def _release_copied(self, name: str, held: torch.Tensor) -> torch.Tensor:
        """Drop `name`'s file pages from this process unless `held` is the map itself."""
        if not self._in_file(name, held):
            self.model_file.release(name)
        return held

    def _in_file(self, name: str, t: torch.Tensor) -> bool:
        """`t` lies in the memory map of `name` (used in place, zero-copy)."""
        if t.device.type != "cpu":
            return False
        raw = self.model_file.raw(name)
        lo = raw.__array_interface__["data"][0]
        start = t.data_ptr()
        return lo <= start < lo + raw.nbytes

    def _stored(self, name: str, qtype: QT) -> torch.Tensor:
        raw = self.model_file.raw(name)
        with warnings.catch_warnings():
            # The map is read-only and torch has no read-only tensors; the backend never writes
            # to weights, so sharing the mapped pages is safe.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            t = torch.from_numpy(raw)
        return t.view(torch.bfloat16) if qtype == QT.BF16 else t  # BF16 raw is uint16 bits

    def _dequantized(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        rows, cols = shape
        out = torch.empty(shape, dtype=self.widened_dtype, device=self.device)
        step = max(1, _SLAB_ELEMENTS // cols)
        for start in range(0, rows, step):
            stop = min(start + step, rows)
            slab = self.model_file.dequantize_rows(name, np.arange(start, stop))
            out[start:stop].copy_(torch.from_numpy(slab))  # rounds to the widened dtype
        return out
