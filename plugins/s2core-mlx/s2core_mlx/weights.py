"""Weight matrices on MLX: kept in their GGUF type where MLX can use it, widened otherwise.

A matrix is used two ways: as a projection (x @ W^T) and, for embedding tables, by gathering
rows. `DenseMatrix` holds F32/F16/BF16 as stored (and the widened types); `QuantizedMatrix`
holds the GGUF quants that map exactly onto MLX's affine format (see gguf_quant; Q2_K, Q3_K
and Q6_K through the split layout of sub_blocks) and multiplies with mx.quantized_matmul.
A quantized tensor with an infinite or NaN scale is widened instead, with a warning
(s2core.gguf.blocks says why).

Tensors are read one at a time from the memory map. `mx.array(numpy)` always copies (MLX
allocates its own buffer and copies into it, on Linux and on macOS alike: it never wraps the
caller's memory), so every tensor is an MLX copy and its file pages are released right after
(`ModelFile.release`): otherwise the pages read while copying stay resident beside the copy
and the file counts twice.
"""

from __future__ import annotations

import ctypes
import sys
import warnings
from dataclasses import dataclass
from typing import Union

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as QT

from s2core.plugin import QUANTIZED_TYPES, NonFiniteScalesWarning, non_finite_scale_blocks
from s2core.plugin import ModelFile

from . import gguf_quant, sub_blocks

MX_DTYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
NP_DTYPES = {"f32": np.float32, "f16": np.float16}


@dataclass(frozen=True)
class DenseMatrix:
    w: mx.array  # [out, in]

    def project(self, x: mx.array) -> mx.array:
        """x @ W^T. A float16/bfloat16 W is promoted to float32 (compute stays float32)."""
        return x @ self.w.T

    def rows(self, ids: mx.array) -> mx.array:
        return self.w[ids].astype(mx.float32)

    def arrays(self) -> list[mx.array]:
        return [self.w]


@dataclass(frozen=True)
class QuantizedMatrix:
    packed: mx.array  # uint32 [out, in * bits / 32]
    scales: mx.array  # float32, or float16 where exact [out, in / group_size]
    biases: mx.array | None  # same type as scales; None: bias_factor * scales
    bits: int
    group_size: int
    bias_factor: float = 0.0
    #: the split layout (sub_blocks): each 16 weights padded to a group of 32
    split: bool = False

    def _scales_biases(self, ids: mx.array | None = None) -> tuple[mx.array, mx.array]:
        """Scales and biases as float32 (float16 ones widen exactly). MLX's quantized kernels
        take one float type for activations, scales and biases; with float32 activations and
        float16 scales it would insert this very conversion itself. Doing it here keeps the
        product float32 whatever MLX's promotion rules become."""
        s = (self.scales if ids is None else self.scales[ids]).astype(mx.float32)
        if self.biases is None:
            return s, s * self.bias_factor  # a power of two times a float16: exact
        b = self.biases if ids is None else self.biases[ids]
        return s, b.astype(mx.float32)

    def project(self, x: mx.array) -> mx.array:
        scales, biases = self._scales_biases()
        if self.split:
            x = interleave_zeros(x)
        return mx.quantized_matmul(x, self.packed, scales, biases, transpose=True,
                                   group_size=self.group_size, bits=self.bits)

    def rows(self, ids: mx.array) -> mx.array:
        """Only the gathered rows are decoded (a lookup never widens the whole table)."""
        scales, biases = self._scales_biases(ids)
        out = mx.dequantize(self.packed[ids], scales, biases, group_size=self.group_size,
                            bits=self.bits)
        if self.split:  # drop each group's 16 padding values
            out = out.reshape(out.shape[0], -1, gguf_quant.GROUP_SIZE)[:, :, :sub_blocks.SUB_BLOCK]
            out = out.reshape(out.shape[0], -1)
        return out

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.packed, self.scales, self.biases) if a is not None]

    @classmethod
    def from_affine(cls, a: gguf_quant.AffineWeights, bias_factor: float | None = None,
                    split: bool = False) -> "QuantizedMatrix":
        if bias_factor is not None:
            return cls(mx.array(a.packed), mx.array(a.scales), None, a.bits, a.group_size,
                       bias_factor, split)
        return cls(mx.array(a.packed), mx.array(a.scales), mx.array(a.biases), a.bits,
                   a.group_size, split=split)


def interleave_zeros(x: mx.array) -> mx.array:
    """(n, in) -> (n, 2 in): every 16 values followed by 16 zeros (the split layout's rows)."""
    n = x.shape[0]
    runs = x.reshape(n, -1, sub_blocks.SUB_BLOCK)
    return mx.concatenate([runs, mx.zeros_like(runs)], axis=-1).reshape(n, -1)


Matrix = Union[DenseMatrix, QuantizedMatrix]


def load_vector(mf: ModelFile, name: str) -> mx.array:
    """Norm gains (F32 in real files), as float32."""
    out = mx.array(mf.dequantize(name))
    mf.release(name)
    return out


def load_matrix(mf: ModelFile, name: str, widened_dtype: str = "f32",
                scale_dtype: str = "f16", split_sub_blocks: bool = True) -> Matrix:
    """A 2-D tensor in the best form MLX can use without changing a single value.

    `scale_dtype` "f16": the quants whose scales and biases are exact in float16 keep them so
    (when every one of this tensor's is; see gguf_quant.narrowed), and where the bias is a fixed
    multiple of the scale (Q8_0, Q4_0, Q5_0) only the scales are kept: MLX holds exactly the
    file's bytes. "f32": float32 scales and biases, both stored (no per-product widening).
    `split_sub_blocks`: Q2_K/Q3_K/Q6_K in the split layout (sub_blocks), else widened."""
    qtype = mf.info(name).type
    if qtype in QUANTIZED_TYPES and not _finite_scales(mf, name, qtype, widened_dtype):
        qtype = None  # widened below
    if qtype is not None and split_sub_blocks and sub_blocks.is_split_type(qtype):
        affine = sub_blocks.convert_split(mf.raw(name), qtype)
        mf.release(name)
        out: Matrix = QuantizedMatrix.from_affine(
            affine, sub_blocks.BIAS_FACTORS.get(qtype), split=True)
    elif gguf_quant.is_convertible(qtype):
        affine = gguf_quant.convert(mf.raw(name), qtype)
        mf.release(name)  # converted, never read again: released before the copy (lower peak)
        factor = None
        if scale_dtype == "f16" and qtype in gguf_quant.F16_EXACT_TYPES:
            affine = gguf_quant.narrowed(affine) or affine
            factor = gguf_quant.bias_factor(affine, qtype)
        out = QuantizedMatrix.from_affine(affine, factor)
    else:
        if qtype in (QT.F32, QT.F16):
            out = DenseMatrix(mx.array(np.ascontiguousarray(mf.raw(name))))
        elif qtype == QT.BF16:  # numpy has no bfloat16: move the bit patterns, reinterpret
            out = DenseMatrix(mx.array(np.ascontiguousarray(mf.raw(name))).view(mx.bfloat16))
        else:
            # Q2_K, Q3_K, Q6_K with split_sub_blocks=False, or non-finite scales. gguf decodes
            # to float32; the narrowing to f16 (if asked) happens in NumPy, so MLX receives and
            # holds only the final type.
            with np.errstate(over="ignore"):
                out = DenseMatrix(mx.array(mf.dequantize(name, NP_DTYPES[widened_dtype])))
        mf.release(name)  # MLX holds its own copy now
    mx.eval(out.arrays())  # nothing lazy left (the bf16 view): load is where memory is taken
    return out


def _finite_scales(mf: ModelFile, name: str, qtype: QT, widened_dtype: str) -> bool:
    bad = non_finite_scale_blocks(mf.raw(name), qtype)
    if bad:
        warnings.warn(f"{name} ({qtype.name}): {bad} block(s) with an infinite or NaN scale; "
                      f"widened to {widened_dtype} as gguf decodes it instead of kept "
                      "quantized", NonFiniteScalesWarning, stacklevel=4)
    return not bad


@dataclass(frozen=True)
class WeightLoader:
    """load_matrix / load_vector with the backend's options bound."""

    model_file: ModelFile
    widened_dtype: str = "f32"
    scale_dtype: str = "f16"
    split_sub_blocks: bool = True

    def matrix(self, name: str) -> Matrix:
        return load_matrix(self.model_file, name, self.widened_dtype, self.scale_dtype,
                           self.split_sub_blocks)

    def vector(self, name: str) -> mx.array:
        return load_vector(self.model_file, name)


def return_freed_heap() -> None:
    """Hand the heap that load's NumPy temporaries freed back to the OS (glibc's malloc_trim).

    Converting a quantized tensor allocates chunk-sized temporaries that glibc keeps in its
    heap once freed (its mmap threshold grows after the first large free): about 60 MB of RSS
    after loading a 1.4 GB q8_0 file, held for nothing. A no-op where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # another C library (musl): nothing to trim this way


def storage_bytes(m: Matrix) -> int:
    """Device bytes a matrix occupies (for reports and benchmarks)."""
    return sum(a.nbytes for a in m.arrays())
