"""Weight matrices on MLX: kept in their GGUF type where MLX can use it, widened otherwise.

A matrix is used two ways: as a projection (x @ W^T) and, for embedding tables, by gathering
rows. `DenseMatrix` holds F32/F16/BF16 as stored (and the widened types); `QuantizedMatrix`
holds the GGUF quants that map exactly onto MLX's affine format (see gguf_quant) and
multiplies with mx.quantized_matmul. Tensors are read one at a time from the memory map.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as QT

from s2core.gguf_file import ModelFile

from . import gguf_quant

MX_DTYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}


@dataclass(frozen=True)
class DenseMatrix:
    w: mx.array  # [out, in]

    def project(self, x: mx.array) -> mx.array:
        """x @ W^T. A float16/bfloat16 W is promoted to float32 (compute stays float32)."""
        return x @ self.w.T

    def rows(self, ids: mx.array) -> mx.array:
        return self.w[ids].astype(mx.float32)


@dataclass(frozen=True)
class QuantizedMatrix:
    packed: mx.array  # uint32 [out, in * bits / 32]
    scales: mx.array  # float32 [out, in / group_size]
    biases: mx.array
    bits: int
    group_size: int

    def project(self, x: mx.array) -> mx.array:
        return mx.quantized_matmul(x, self.packed, self.scales, self.biases, transpose=True,
                                   group_size=self.group_size, bits=self.bits)

    def rows(self, ids: mx.array) -> mx.array:
        """Only the gathered rows are decoded (a lookup never widens the whole table)."""
        return mx.dequantize(self.packed[ids], self.scales[ids], self.biases[ids],
                             group_size=self.group_size, bits=self.bits)

    @classmethod
    def from_affine(cls, a: gguf_quant.AffineWeights) -> "QuantizedMatrix":
        return cls(mx.array(a.packed), mx.array(a.scales), mx.array(a.biases), a.bits,
                   a.group_size)


Matrix = Union[DenseMatrix, QuantizedMatrix]


def load_vector(mf: ModelFile, name: str) -> mx.array:
    """Norm gains (F32 in real files), as float32."""
    return mx.array(mf.dequantize(name))


def load_matrix(mf: ModelFile, name: str, widened_dtype: str = "f32") -> Matrix:
    """A 2-D tensor in the best form MLX can use without changing a single value."""
    qtype = mf.info(name).type
    if gguf_quant.is_convertible(qtype):
        return QuantizedMatrix.from_affine(gguf_quant.convert(mf.raw(name), qtype))
    if qtype in (QT.F32, QT.F16):
        return DenseMatrix(mx.array(np.ascontiguousarray(mf.raw(name))))
    if qtype == QT.BF16:  # numpy has no bfloat16: move the bit patterns and reinterpret
        return DenseMatrix(mx.array(np.ascontiguousarray(mf.raw(name))).view(mx.bfloat16))
    # Q2_K, Q3_K, Q6_K: 16-value sub-blocks do not fit MLX's groups (32, 64, 128)
    return DenseMatrix(mx.array(mf.dequantize(name)).astype(MX_DTYPES[widened_dtype]))


def storage_bytes(m: Matrix) -> int:
    """Device bytes a matrix occupies (for reports and benchmarks)."""
    if isinstance(m, DenseMatrix):
        return m.w.nbytes
    return m.packed.nbytes + m.scales.nbytes + m.biases.nbytes
