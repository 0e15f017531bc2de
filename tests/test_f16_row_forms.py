"""The F16 few-row kernels' two forms (f16.py): f16_row_pairs, which AVX2 builds take from
eight rows, gives f16_rows' bits, so which form a target takes changes no number."""

from __future__ import annotations

import numpy as np
import pytest

from s2core_numpy import plugin
from s2core_numpy.plugin import MAX_BATCH_SEQUENCES

pytestmark = pytest.mark.skipif(not plugin.numba_available(), reason="numba not installed")


def _f16_matrix(n_out: int, n_in: int):
    from s2core_numpy.f16 import F16Matrix
    w = (np.random.default_rng(n_in).standard_normal((n_out, n_in)) * 0.05).astype(np.float16)
    w.flat[:3] = [0.0, -0.0, 6e-8]  # zeros and a float16 subnormal
    return F16Matrix.from_raw(w)


@pytest.mark.parametrize("n_rows", [2, 4, 8, 12])
@pytest.mark.parametrize("n_out,n_in", [(100, 96), (130, 2 * 2048 + 320)])
def test_row_pairs_give_four_rows_bits(n_out, n_in, n_rows):
    """Inputs within one span and across three (the last one short), outputs past a whole
    tile: the same float32 bits as four rows of a tile (two rows: f16_pair), not zeros."""
    from s2core_numpy import f16
    assert n_in < f16.PAIR_SPAN or n_in % f16.PAIR_SPAN
    m = _f16_matrix(n_out, n_in)
    codes = m.codes.view(np.int16)
    x = np.random.default_rng(n_rows).standard_normal((n_rows, n_in)).astype(np.float32)
    width = codes.shape[0] * f16.TILE
    four, pairs = (np.full((n_rows, width), np.nan, np.float32) for _ in range(2))
    (f16.f16_pair if n_rows == 2 else f16.f16_rows)(codes, x, four)
    f16.f16_row_pairs(codes, x, pairs)
    np.testing.assert_array_equal(pairs, four)
    assert np.abs(pairs[:, :n_out]).min() > 0


@pytest.mark.parametrize("wide", [True, False], ids=["avx512-form", "avx2-form"])
@pytest.mark.parametrize("n_rows", [7, 8, 9, MAX_BATCH_SEQUENCES])
def test_each_targets_form_gives_each_row_its_one_row_product(monkeypatch, wide, n_rows):
    """F16Matrix's products with either form chosen (wide_registers as each kind of CPU
    answers): every row equals its one-row product bit for bit, and float64 within float32
    rounding."""
    from s2core_numpy import f16
    monkeypatch.setattr(f16, "wide_registers", lambda: wide)
    m = _f16_matrix(200, 2048 + 96)
    x = np.random.default_rng(n_rows).standard_normal((n_rows, 2048 + 96)).astype(np.float32)
    out = m(x)
    np.testing.assert_array_equal(out, np.stack([m(x[r:r + 1])[0] for r in range(n_rows)]))
    ref = x.astype(np.float64) @ m.dequantize().astype(np.float64).T
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


def test_the_benchmark_times_both_forms_and_records_the_machine(tmp_path):
    """benchmarks/f16_row_forms.py on small shapes: a row for each shape and row count, with
    both forms' times, their ratio, the target's pick and the CPU's flags."""
    import json
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import f16_row_forms
    from s2core_numpy import f16
    assert f16_row_forms.main(["--shapes", "130x2400,64x96", "--rows", "2,8", "--reps", "3",
                               "--bytes", "1e6", "--out", str(tmp_path)]) == 0
    [written] = tmp_path.glob("f16-row-forms-*.json")
    report = json.loads(written.read_text())
    assert [(r["out"], r["in"], r["rows"]) for r in report["results"]] == [
        (130, 2400, 2), (130, 2400, 8), (64, 96, 2), (64, 96, 8)]
    for r in report["results"]:
        assert r["four_rows_ms"] > 0 and r["pairs_ms"] > 0
        assert r["pairs_over_four_rows"] == pytest.approx(r["pairs_ms"] / r["four_rows_ms"])
    assert report["wide_registers"] == f16.wide_registers()
    assert report["cpu_flags"]
    assert written.with_suffix(".md").exists()
