"""How the NumPy backend holds a matrix: float32 (zero-copy for F32 files) or Q8_0 blocks.

`linear` and `gather` are the only places that care which; everything else sees float32.
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np
from gguf import GGMLQuantizationType as QT

from s2core.gguf_file import ModelFile

from .plugin import numba_available

#: turn the numba kernels off for the whole process (tests of the fallback path; also the
#: `native_q8_0=False` backend option does it for one backend)
USE_NUMBA = True

Weight = Union[np.ndarray, Any]  # float32 ndarray or q8_0.Q8Matrix


def q8_0_kernels_possible() -> bool:
    return USE_NUMBA and numba_available()


class WeightLoader:
    """Loads one tensor at a time, so at most one tensor's copy is in flight."""

    def __init__(self, mf: ModelFile, native_q8_0: bool):
        self.mf = mf
        self.native_q8_0 = native_q8_0

    def matrix(self, name: str) -> Weight:
        """A matrix used in products (and maybe row lookups)."""
        if self.native_q8_0 and self.mf.info(name).type == QT.Q8_0:
            # numba is imported here, on the first Q8_0 tensor: never at probe time, and not
            # at all for files without Q8_0 (its import takes ~0.3 s and maps LLVM's pages)
            from .q8_0 import Q8Matrix
            m = Q8Matrix.from_raw(self.mf.raw(name))
            self.mf.release(name)  # the codes were copied into the tiled layout
            return m
        return self.vector(name)

    def vector(self, name: str) -> np.ndarray:
        """float32. F32 tensors stay in the memory map; the file pages of widened copies are
        released so the process does not hold the tensor twice."""
        return self.mf.dequantize(name, np.float32, release=True)


def linear(x: np.ndarray, w: Weight) -> np.ndarray:
    """x (n, in) @ w^T -> (n, out), float32."""
    if isinstance(w, np.ndarray):
        return x @ w.T
    return w(x)


def gather(w: Weight, rows: np.ndarray) -> np.ndarray:
    """Rows of a lookup table as float32 (n, in)."""
    if isinstance(w, np.ndarray):
        return w[rows].astype(np.float32)
    return w.rows(rows)
