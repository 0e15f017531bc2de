"""Codes files: fish-speech's and s2.cpp's `.npy` of integers [num_codebooks, T].

Reading checks the `.npy` header before the body: a regular file, a 2-D shape within
MAX_CODEBOOKS x MAX_FRAMES (or the caller's bound), a plain integer dtype (never an object
array: nothing is unpickled), and a file exactly as long as the header says. Only then is the
body read. Writing goes to a unique temporary name renamed into place, under exactly the path
given (np.save would append `.npy` to a name without it).
"""

from __future__ import annotations

import os
import tokenize
from pathlib import Path

import numpy as np

from s2core.errors import InvalidInputError
from s2core.fileio import atomic_output, open_regular

#: frames a codes file may hold: ~30 minutes of audio at S2 Pro's 21.5 frames a second
MAX_FRAMES = 40_000
#: codebooks a codes file may hold (S2 Pro has 10)
MAX_CODEBOOKS = 64
#: an .npy header is a few dozen bytes; numpy's own limit is 10 000
MAX_HEADER_BYTES = 10_000


def _error(message: str, check: str) -> InvalidInputError:
    return InvalidInputError(check, message)


def read_codes(path: str | os.PathLike, max_frames: int = MAX_FRAMES,
               check: str = "codes_file") -> np.ndarray:
    """The codes array of an .npy file, every size checked from its header first (InvalidInput
    Error with `check` (default `codes_file`): not a regular file, not an .npy, not 2-D
    numbers, a length that disagrees with the header; `codes_frames`: more than max_frames)."""
    path = Path(path)
    with open_regular(path, lambda m, c: _error(m, check), "codes file") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(
                    f, max_header_size=MAX_HEADER_BYTES)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(
                    f, max_header_size=MAX_HEADER_BYTES)
            else:
                raise ValueError(f"unsupported .npy version {version}")
        except (ValueError, EOFError, OSError, SyntaxError, TypeError, KeyError, IndexError,
                tokenize.TokenError) as exc:  # numpy parses the header as a Python literal
            raise _error(f"{path}: not a NumPy .npy array ({exc})", check) from None
        if dtype.hasobject or dtype.kind not in "biuf" or dtype.subdtype is not None:
            raise _error(f"{path}: holds {dtype}, not plain numbers (codes are integers)",
                         check)
        if len(shape) != 2:
            raise _error(f"{path}: shape {shape}; codes are [num_codebooks, T]", check)
        n_cb, frames = shape
        if not 0 < n_cb <= MAX_CODEBOOKS or frames > max_frames:
            raise _error(f"{path}: shape {shape}: at most {MAX_CODEBOOKS} codebooks and "
                         f"{max_frames} frames are read", "codes_frames")
        body = n_cb * frames * dtype.itemsize
        if size - f.tell() != body:
            raise _error(f"{path}: the header says {body} bytes of data, the file has "
                         f"{size - f.tell()}", check)
        data = np.fromfile(f, dtype=dtype, count=n_cb * frames)
    return data.reshape(shape, order="F" if fortran else "C")


def write_codes(path: str | os.PathLike, codes: np.ndarray) -> Path:
    """Save codes as .npy under exactly `path`, atomically."""
    path = Path(path)
    with atomic_output(path, _error, "codes file") as f:
        np.save(f, np.asarray(codes), allow_pickle=False)
    return path
