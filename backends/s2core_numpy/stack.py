"""Scratch arrays on the stack, for the kernels' accumulators and per-block buffers.

numba's np.empty / np.zeros allocate on the heap. LLVM cannot tell such a buffer from the
weights or the input (numba marks nothing `noalias`), so in a loop over the inputs it loads
and stores every accumulator on every pass, and it guards vectorized loops with run-time
overlap checks. A buffer from `alloca` is known to overlap nothing: LLVM keeps a tile's
accumulators in vector registers across the whole loop. Four rows of a 9728 x 2560 F16
product went from 1.57-2.68 ms to 1.08-1.70 ms that way (one row: 1.06-1.42 ms; four runs),
bit for bit the same numbers.

`stack_array(rows, cols, dtype)` is a (rows, cols) array (both compile-time constants: literal
numbers or module globals, not expressions) living in the calling function's frame: it must
not be returned or kept beyond the call. Its contents start undefined.

`stack_tile(dtype)`, a tile's accumulators, is aligned to a cache line (TILE_ALIGN): the
tiled kernels' four rows of sums (f16.py, q8_0.py, quant_kernels.py) outnumber AVX2's 16
vector registers, so LLVM keeps some of them in the array, loaded and stored on every input.
With the element's 4-byte alignment, where those 32-byte accesses fell depended on where the
calling thread's stack sat, which Linux randomizes per process in steps of 16 bytes: at two
of every four places a Haswell build's four F16 rows of a tile in cache took 1.42x the time,
Q8_0's 1.53x, eight rows 2.57x and 1.63x (`stack-alignment-20261207-2106-...-avx2`); in the
server, four f16 sequences' frames ran 320 ms in some processes and 420-730 ms in others.
Aligned: 1.01-1.03x at every place. Other stack arrays keep their element's alignment:
aligning the integer products' (simd.py) made LLVM realign their frames and cost a VNNI
build's Q4_K products 1.19x (their vectors of sums stay in registers).
"""

from __future__ import annotations

from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .tiled import TILE

#: bytes a tile's accumulators (stack_tile) are aligned to, read when a kernel compiles (None:
#: the element's; benchmarks/stack_alignment.py compiles kernels both ways)
TILE_ALIGN = 64


@intrinsic
def _alloca(typingctx, rows, cols, dtype, line):
    """A pointer to rows * cols elements of dtype, allocated in the function's entry block
    (once per call, not per loop pass); aligned to TILE_ALIGN where `line` (a literal bool)."""
    literal = (isinstance(rows, types.IntegerLiteral) and isinstance(cols, types.IntegerLiteral)
               and isinstance(line, types.BooleanLiteral))
    if not literal or not isinstance(dtype, types.NumberClass):
        return None
    element = dtype.dtype

    def codegen(context, builder, signature, args):
        pointer = cgutils.alloca_once(builder, context.get_data_type(element),
                                      size=rows.literal_value * cols.literal_value)
        if line.literal_value and TILE_ALIGN:
            pointer.align = TILE_ALIGN
        return pointer

    return types.CPointer(element)(rows, cols, dtype, line), codegen


@njit(inline="always")
def stack_array(rows, cols, dtype):
    """A (rows, cols) array of dtype on the stack (see the module's note)."""
    return carray(_alloca(rows, cols, dtype, False), (rows, cols))


@njit(inline="always")
def stack_tile(dtype):
    """A (TILE,) array of dtype on the stack, aligned to a cache line: one value per output of
    a tile (tiled.py)."""
    return carray(_alloca(1, TILE, dtype, True), (1, TILE))[0]
