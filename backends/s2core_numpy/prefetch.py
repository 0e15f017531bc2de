"""Software prefetch: ask for the cache lines a kernel will read a little later.

A quantized kernel alternates between waiting for memory and computing: one core streams a
block of tiles, then unpacks and multiplies it, and the hardware prefetcher does not run far
enough ahead of that pattern to hide the wait. Measured here (2 cores, 155776 x 2560, the S2
Pro output head): the blocks alone stream at ~60 GB/s and a Q6_K product computes at ~37 GB/s
from cache, yet from memory it ran at 18 GB/s, the sum of the two times. Asking for the
block two ahead while computing this one, a few lines per step of the compute (a burst of all
of a block's lines at once stalls on the core's few outstanding misses), overlaps them:
Q6_K 18.3 -> 8.6 ms, Q5_K 17.5 -> 8.6 ms, Q4_K 8.6 -> 6.2 ms on that matrix.

`prefetch(a, i)` asks for the line holding a[i] (a 1-D array) into L1; nothing is read or
checked, and an index past the end is clamped, so a kernel can ask for "the block two
ahead" without testing whether there is one.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

#: blocks ahead of the one being computed whose lines a kernel asks for
AHEAD = 2


def emit_prefetch(builder: ir.IRBuilder, pointer: ir.Value, locality: int = 3) -> None:
    """The IR of a prefetch: llvm.prefetch(pointer, read, locality, data). Locality 3 keeps
    the line in all levels, L1 included (x86 prefetcht0); 2 stops at L2 (prefetcht1), for a
    kernel that asks for its lines further ahead than L1 holds. Every kernel that asks for
    lines emits it here."""
    byte_pointer = builder.bitcast(pointer, ir.IntType(8).as_pointer())
    i32 = ir.IntType(32)
    signature_ir = ir.FunctionType(ir.VoidType(), [byte_pointer.type, i32, i32, i32])
    # llvmlite names it for its pointer type ("llvm.prefetch.p0i8" for i8*); LLVM 15 and
    # later take that name for their opaque-pointer "llvm.prefetch.p0"
    function = builder.module.declare_intrinsic("llvm.prefetch", [byte_pointer.type],
                                                signature_ir)
    builder.call(function, [byte_pointer, i32(0), i32(locality), i32(1)])


@intrinsic
def _prefetch(typingctx, array, index):
    """emit_prefetch(&array[index])."""
    if not isinstance(array, types.Array) or array.ndim != 1:
        return None

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        view = context.make_array(array_type)(context, builder, args[0])
        pointer = cgutils.get_item_pointer(context, builder, array_type, view, [args[1]],
                                           wraparound=False)
        emit_prefetch(builder, pointer)
        return context.get_dummy_value()

    return types.none(array, types.intp), codegen


@njit(inline="always")
def prefetch(a, i):
    """Ask for the cache line holding a[i] (clamped to a's last element)."""
    _prefetch(a, min(i, a.shape[0] - 1))


@njit(inline="always")
def prefetch_rows(flat, row_bytes, first, stop):
    """Ask for rows first..stop-1 of `flat` seen as rows of row_bytes (one line each when
    row_bytes is 64, a tile's row of bytes)."""
    for r in range(first, stop):
        prefetch(flat, r * row_bytes)
