"""AMX products (backends/s2core_numpy/amx.py): for every type and any number of rows, the
same bits as the VNNI kernels (simd.py), so a product's numbers never depend on which path or
batch computed them; IntDotMatrix takes AMX only from its measured row counts; and
S2CORE_NO_AMX turns it off. Skipped with the reason where this CPU or kernel has no AMX."""

from __future__ import annotations

import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

pytest.importorskip("numba")

from s2core.embedded.kquants import quantize_k  # noqa: E402

from s2core_numpy import act_quant, amx, int_dots, simd  # noqa: E402

needs_amx = pytest.mark.skipif(not amx.available(), reason=f"no AMX here: "
                               f"{amx.unavailable_reason()}")


def matrix(qtype: QT, n_out: int, n_in: int, seed: int) -> int_dots.IntDotMatrix:
    w = np.random.default_rng(seed).standard_normal((n_out, n_in)).astype(np.float32)
    raw = gguf.quants.quantize(w, qtype) if qtype == QT.Q8_0 else quantize_k(w, qtype)
    return int_dots.IntDotMatrix.from_raw(raw.view(np.uint8).reshape(n_out, -1), qtype)


@needs_amx
@pytest.mark.parametrize("qtype", sorted(int_dots.TYPES), ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 3, 8, 16, 17, 40])
def test_amx_products_equal_the_vnni_kernels_bit_for_bit(qtype, rows):
    """37 outputs (a padded last tile), 768 inputs (3 super-blocks), activations with large and
    tiny values; 17 and 40 rows take a last chunk of 1 and 8 rows."""
    m = matrix(qtype, 37, 768, rows)
    rng = np.random.default_rng(rows)
    x = (rng.standard_normal((rows, 768)) * rng.choice([1e-3, 1.0, 40.0], (rows, 1))).astype(
        np.float32)
    xq, xd, xs = act_quant.quantize(m.dot_type, x)
    want = np.empty((rows, m.codes.shape[0] * 16), np.float32)
    got = np.full_like(want, np.nan)
    simd.products(m.kind, m.codes, xq, xd, xs, want, simd.LONE_BLOCK[m.kind])
    amx.products(m.kind, m.codes, xq, xd, xs, got)
    assert np.array_equal(got, want), f"{qtype.name}, {rows} rows: AMX differs from VNNI by " \
        f"{np.nanmax(np.abs(got - want))}"


@needs_amx
@pytest.mark.parametrize("qtype", [t for t in sorted(int_dots.TYPES) if int(t) in amx.MIN_ROWS],
                         ids=lambda t: t.name)
def test_a_batch_through_amx_equals_its_rows_alone(qtype):
    """IntDotMatrix sends a product of enough rows to AMX (MIN_ROWS); each row equals the same
    row multiplied alone (the VNNI kernels)."""
    m = matrix(qtype, 64, 512, 5)
    rows = amx.MIN_ROWS[m.kind]
    x = np.random.default_rng(6).standard_normal((rows, 512)).astype(np.float32)
    batch = m(x)
    for r in range(rows):
        assert np.array_equal(batch[r:r + 1], m(x[r:r + 1])), f"{qtype.name} row {r}"


def test_s2core_no_amx_turns_it_off():
    """With S2CORE_NO_AMX set, the VNNI kernels serve every product, the reason says so, and
    the probe no longer promises AMX."""
    code = ("from s2core_numpy import amx, plugin; print(amx.unavailable_reason()); "
            "print(plugin.amx_expected(), 'AMX' in plugin.probe().reason)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "S2CORE_NO_AMX": "1"}, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["S2CORE_NO_AMX is set", "False False"]


def test_the_probe_promises_amx_exactly_where_it_runs():
    """plugin.amx_expected() (the probe's cheap reading of the CPU flags and the kernel,
    without numba) agrees with amx.available() (numba's target, and Linux's grant)."""
    from s2core_numpy import plugin
    assert plugin.amx_expected() == amx.available(), amx.unavailable_reason()
    assert ("AMX" in plugin.probe().reason) == amx.available()


def _file_codes(qtype: QT, raw: np.ndarray) -> np.ndarray:
    """The unsigned codes (n_out, n_in) of a Q4_K or Q6_K matrix's file bytes, as ggml's
    dequantization reads them (Q4_K: qs[32c + l] holds inputs 64c + l and 64c + 32 + l; Q6_K:
    per half, ql[l], ql[l + 32] and qh[l] hold inputs l, l + 32, l + 64, l + 96)."""
    per = 144 if qtype == QT.Q4_K else 210
    blocks = raw.reshape(raw.shape[0], -1, per).astype(np.int32)
    if qtype == QT.Q4_K:
        qs = blocks[..., 16:].reshape(*blocks.shape[:2], 4, 32)
        codes = np.stack([qs & 15, qs >> 4], axis=3)  # [chunk][low, high][l]
    else:
        ql = blocks[..., :128].reshape(*blocks.shape[:2], 2, 2, 32)  # [half][run][l]
        qh = blocks[..., 128:192].reshape(*blocks.shape[:2], 2, 1, 32)
        low = np.concatenate([ql & 15, ql >> 4], axis=3)  # [half][k][l]
        high = np.stack([(qh[..., 0, :] >> s) & 3 for s in (0, 2, 4, 6)], axis=3)
        codes = low | (high << 4)
    return codes.reshape(raw.shape[0], -1)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
def test_the_unpacked_tile_block_holds_the_files_codes_in_input_order(qtype):
    """Before its tile ops, AMX unpacks a K-quant tile-block (the packed layout int_dots.py
    writes and simd.py reads) into plain codes: 4 inputs of the 16 rows per 64 bytes, input
    after input. Plain vector code, so checked on any CPU, AMX or not: a change of the packed
    layout that this unpacking missed fails here, not only where AMX runs."""
    from numba import njit
    unpack = amx._unpack_q4_k if qtype == QT.Q4_K else amx._unpack_q6_k

    @njit
    def unpacked(flat, at):
        out = np.zeros(4096, np.uint8)
        unpack(flat, at, out)
        return out

    w = np.random.default_rng(9).standard_normal((32, 512)).astype(np.float32)
    raw = quantize_k(w, qtype).view(np.uint8).reshape(32, -1)
    m = int_dots.IntDotMatrix.from_raw(raw, qtype)
    codes = _file_codes(qtype, raw)
    flat = m.codes.reshape(-1)
    for tile in range(2):
        for sb in range(2):
            got = unpacked(flat, (tile * 2 + sb) * m.codes.shape[2])
            want = codes[16 * tile:16 * tile + 16, 256 * sb:256 * sb + 256]
            # byte (v // 4) * 64 + 4 j + v % 4 holds input v of row j
            want = want.reshape(16, 64, 4).transpose(1, 0, 2).reshape(-1)
            assert np.array_equal(got, want), \
                f"{qtype.name}: tile {tile}, super-block {sb}: unpacked codes differ at " \
                f"{np.flatnonzero(got != want)[:8]}"
