"""How the NumPy backend holds a matrix: float32 (zero-copy for F32 files; with numba wrapped
for few-row products, f32_rows.py), or, with numba, in its file type: F16, Q8_0 and the block-quantized types Q2_K..Q6_K, Q4_0, Q4_1, Q5_0, Q5_1
(tiled.py, f16.py, q8_0.py, quants.py).

`linear`, `gather` and `row_window` are the only places that care which; everything else sees
float32.
"""

from __future__ import annotations

import warnings
from typing import Any, Union

import numpy as np
from gguf import GGMLQuantizationType as QT

from s2core.plugin import NonFiniteScalesWarning, non_finite_scale_blocks
from s2core.plugin import ModelFile

from s2core.plugin import LogitRows, check_option

from .plugin import NUMBA_BLOCK_TYPES, NUMBA_TYPES, default_arithmetic, numba_available

#: turn the numba kernels off for the whole process (tests of the fallback path; the
#: `numba_kernels=False` backend option does it for one backend)
USE_NUMBA = True

Weight = Union[np.ndarray, Any]  # float32 ndarray, f32_rows.F32Matrix or a kept type's matrix


def numba_kernels_possible() -> bool:
    return USE_NUMBA and numba_available()


def arithmetic_for(arithmetic: str | None, mf: ModelFile) -> str:
    """The arithmetic a load of `mf` uses: the one named, else the default for its matrices
    (plugin.default_arithmetic). "ggml" works on kept and widened weights alike: it rounds
    the activation by the file's type of the weight."""
    check_option("arithmetic", arithmetic, (None, "ggml", "f32"))
    if arithmetic is not None:
        return arithmetic
    matrices = [t for t in mf.model_tensors() if len(t.shape) == 2]
    f16 = sum(t.n_bytes for t in matrices if t.type == QT.F16)
    return default_arithmetic(f16 / max(1, sum(t.n_bytes for t in matrices)))


#: the matrix types arithmetic="ggml" multiplies in ggml's own order of float32 sums, from the
#: file's rows (ggml_ops.GgmlRows); quantized ones take the integer kernels, whose blocks are
#: added in their own order (int_dots.py)
GGML_ORDER_TYPES = (QT.F16, QT.F32)


def ggml_order_products(mf: ModelFile) -> bool:
    """Whether arithmetic="ggml" multiplies every matrix of the file in ggml's own order."""
    return all(t.type in GGML_ORDER_TYPES for t in mf.model_tensors() if len(t.shape) == 2)


class WeightLoader:
    """Loads one tensor at a time, so at most one tensor's copy is in flight."""

    def __init__(self, mf: ModelFile, numba_kernels: bool, arithmetic: str = "f32"):
        self.mf = mf
        self.numba_kernels = numba_kernels
        #: "ggml": products round their activation as s2.cpp's ggml does (act_quant.py)
        self.arithmetic = arithmetic
        #: tensors of a kept type widened anyway (an infinite or NaN value or scale)
        self.widened_non_finite: list[str] = []

    def matrix(self, name: str) -> Weight:
        """A matrix used in products (and maybe row lookups)."""
        qtype = self.mf.info(name).type
        mins = None
        if self.arithmetic == "ggml" and qtype in (QT.Q4_1, QT.Q5_1):
            from .act_quant import block_mins  # read before the file's pages are released
            mins = block_mins(self.mf.raw(name), qtype)
        if self.arithmetic == "ggml" and self.numba_kernels:
            integer = self._integer(name)
            if integer is not None:
                return integer
            if qtype in GGML_ORDER_TYPES and len(self.mf.info(name).shape) == 2:
                from .ggml_ops import GgmlRows  # ggml's own order of sums (ggml_ops.py)
                if qtype == QT.F32:
                    return GgmlRows(self.vector(name))
                return GgmlRows(self.mf.raw(name))  # rounds its activation to float16
        packed = self._packed(name) if self.numba_kernels else None
        if packed is not None:
            self.mf.release(name)  # the values were copied into the tiled layout
            weight = packed
        else:
            weight = self.vector(name)
            if self.numba_kernels:  # float32 in place, a few rows without BLAS's packing
                from .f32_rows import F32Matrix
                weight = F32Matrix(weight)
        if self.arithmetic == "ggml":
            from .act_quant import DOT_TYPE, ActivationRounded
            if qtype in DOT_TYPE:
                return ActivationRounded(weight, DOT_TYPE[qtype], mins)
        return weight

    def lookup(self, name: str) -> Weight:
        """A table only read by rows (the codebook embeddings): held as matrix() holds it where
        that is in the file's type (with numba: a step's ten rows of Q4_K then decode in 20 us,
        as gguf decodes them, against 97 us through gguf's own NumPy code, Q8_0 18 against 36,
        on a Zen 4); else FileRows, rather than widen the whole table to float32."""
        if not self.numba_kernels or self.mf.info(name).type.name.lower() not in NUMBA_TYPES:
            return FileRows(self.mf, name)
        return self.matrix(name)

    def _integer(self, name: str) -> Weight | None:
        """arithmetic="ggml" with the CPU's integer dot instructions (int_dots.py), for the
        types and CPUs that have them; None for the others (act_quant.ActivationRounded)."""
        from .int_dots import IntDotMatrix, supported
        info = self.mf.info(name)
        if len(info.shape) != 2 or not supported(info.type, tuple(info.shape)):
            return None
        raw = self.mf.raw(name)
        if non_finite_scale_blocks(raw, info.type):
            return None  # widened as gguf decodes it, and said, by the float path
        matrix = IntDotMatrix.from_raw(raw, info.type)
        self.mf.release(name)
        return matrix

    def _packed(self, name: str) -> Weight | None:
        # numba is imported on the first matrix: never at probe time (its import takes
        # ~0.3 s and maps LLVM's pages)
        qtype = self.mf.info(name).type
        if qtype == QT.Q8_0:
            from .q8_0 import Q8Matrix
            raw = self.mf.raw(name)  # a non-finite scale: widened, as for the other block types
            return self._said(name, qtype, None if non_finite_scale_blocks(raw, qtype)
                              else Q8Matrix.from_raw(raw))
        if qtype == QT.F16:
            from .f16 import F16Matrix
            return self._said(name, qtype, F16Matrix.from_raw(self.mf.raw(name)))
        if qtype.name.lower() in NUMBA_BLOCK_TYPES:
            from .quants import QuantMatrix
            return self._said(name, qtype, QuantMatrix.from_raw(self.mf.raw(name), qtype))
        return None

    def _said(self, name: str, qtype: QT, packed: Weight | None) -> Weight | None:
        """None (an infinite or NaN value or scale: widened as gguf decodes it) is said."""
        if packed is None:
            self.widened_non_finite.append(name)
            warnings.warn(f"{name} ({qtype.name}): infinite or NaN values or scales; widened to "
                          "float32 as gguf decodes it instead of kept as stored",
                          NonFiniteScalesWarning, stacklevel=4)
        return packed

    def vector(self, name: str) -> np.ndarray:
        """float32. F32 tensors stay in the memory map; the file pages of widened copies are
        released so the process does not hold the tensor twice."""
        return self.mf.dequantize(name, np.float32, release=True)


def linear(x: np.ndarray, w: Weight, on_workers: bool = False) -> np.ndarray:
    """x (n, in) @ w^T -> (n, out), float32. on_workers: a float32 w is multiplied on the
    workers too (a call that holds BLAS to one thread, workers.py); kept types choose their
    own path by the number of rows."""
    if isinstance(w, np.ndarray):
        if on_workers:
            from .tile_gemm import dense_gemm
            return dense_gemm(x, w)
        return x @ w.T
    return w(x)


def row_window(w: Weight, start: int, stop: int, n: int) -> tuple[Weight, int] | None:
    """A weight multiplying rows [start, stop) of w and perhaps a few around them, without a
    copy (a view of the whole tiles that hold them), and where row `start` lies in its
    output: (window, lead); each of its output rows has the bits of the whole matrix's
    product of `n` input rows. None where that product goes through BLAS, whose blocking
    follows the shape, so that a slice's rows need not match."""
    if isinstance(w, np.ndarray):
        return None
    return w.row_window(start, stop, n)


def output_logits(hidden: np.ndarray, w: Weight, rows: LogitRows | None) -> np.ndarray:
    """hidden (n, dim) times the output matrix: the logits of every row (rows None), or of
    `rows`' ids only (n, len(rows)), reading only the tiles that hold them."""
    if rows is None:
        return linear(hidden, w)
    windows = [row_window(w, start, stop, hidden.shape[0]) for start, stop in rows.runs]
    if None in windows:
        return rows.take(linear(hidden, w))
    out = np.empty((hidden.shape[0], len(rows)), np.float32)
    at = 0
    for (start, stop), (window, lead) in zip(rows.runs, windows):
        out[:, at:at + stop - start] = linear(hidden, window)[:, lead:lead + stop - start]
        at += stop - start
    return out


class FileRows:
    """A table left in the file: each call decodes only the rows it gathers
    (ModelFile.dequantize_rows, gguf's own decoding)."""

    def __init__(self, mf: ModelFile, name: str):
        self.mf, self.name = mf, name

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return self.mf.dequantize_rows(self.name, ids)


def gather(w: Weight, rows: np.ndarray) -> np.ndarray:
    """Rows of a lookup table as float32 (n, in)."""
    if isinstance(w, np.ndarray):
        return w[rows].astype(np.float32)
    return w.rows(rows)
