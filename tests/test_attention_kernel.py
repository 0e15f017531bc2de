"""NumPy's attention kernel for the newest query row (backends/s2core_numpy/attention.py):
positions give the same bits whichever blocks hold them, its exp, and its code for the
other vector widths (AVX2, and a generic x86 without F16C or FMA, built on this machine in a
subprocess) against the float64 reference. test_numpy_kernels.py checks it against the
float64 reference on this CPU."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from s2core.benchmarking.machine import HASWELL  # noqa: E402
from s2core_numpy import attention, ops  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def context(n_kv: int, end: int, d: int, dtype, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """K and V (n_kv, end, d) of the cache type's values, as the type."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((n_kv, end, d)).astype(dtype) for _ in "kv")


def split(k, v, prefix: int, new: int) -> ops.Keys:
    """The positions of k, v as a decode step sees them: the first `prefix` in a shared
    prefix (None if 0), the next ones in a larger cache, the last `new` as the call's own
    float32 rows (None if 0)."""
    end = k.shape[1]
    cached = end - prefix - new
    cache = tuple(np.concatenate([a[:, prefix:prefix + cached],
                                  np.full_like(a[:, :7], np.nan)], axis=1) for a in (k, v))
    return ops.Keys((k[:, :prefix], v[:, :prefix]) if prefix else None, cache, cached,
                    (k[:, end - new:].astype(np.float32), v[:, end - new:].astype(np.float32))
                    if new else None)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("n_head,n_kv,d", [(32, 8, 128), (6, 2, 72), (4, 4, 200)])
def test_positions_give_the_same_bits_whichever_blocks_hold_them(dtype, n_head, n_kv, d):
    """A shared prefix of 0 .. 9 or 37 positions, the cache's rows and the call's own last
    row (float32, of the same value) or none: every split of the same 61 positions gives the
    bits of the one where the cache holds them all (so Server and speak() agree bit for bit
    on a restored voice). The prefix lengths start row groups (SCORE_ROWS) and the row
    blocks of V's passes at every offset; d = 72 and 200 have columns past the last vector
    and the last block of columns."""
    k, v = context(n_kv, 61, d, dtype, seed=d)
    q = np.random.default_rng(1).standard_normal((1, n_head, d), dtype=np.float32)
    want = attention.attend_last(q, split(k, v, 0, 0), 0.125)
    assert np.isfinite(want).all()
    for prefix in (*range(10), 37):
        for new in (0, 1):
            got = attention.attend_last(q, split(k, v, prefix, new), 0.125)
            assert np.array_equal(got, want), (prefix, new)


def test_float16_and_float32_rows_of_the_same_values_give_the_same_bits():
    """A float16 cache's rows are widened exactly before any arithmetic: the same values in
    a float32 cache give the same output bits."""
    k, v = context(8, 300, 128, np.float16, seed=3)
    q = np.random.default_rng(4).standard_normal((1, 32, 128), dtype=np.float32)
    half = attention.attend_last(q, split(k, v, 0, 0), 0.09)
    full = attention.attend_last(q, split(k.astype(np.float32), v.astype(np.float32), 0, 0), 0.09)
    assert np.array_equal(half, full)


def test_exp_is_within_3_ulp_of_float64_and_keeps_nan():
    """_exp over (-87, 0] (scores less the top score), a NaN, and below -87 the floor
    (~1.6e-38 against exp's 0 or subnormal: nothing a softmax weight next to 1 can show)."""
    from numba import njit

    @njit
    def exp_all(x, out):
        for i in range(x.shape[0]):
            out[i] = attention._exp(x[i])

    x = np.concatenate([-np.geomspace(1e-8, 87, 200001), [0.0]]).astype(np.float32)
    got = np.empty_like(x)
    exp_all(x, got)
    ref = np.exp(x.astype(np.float64))
    ulp = np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert (np.abs(got - ref) / ulp).max() <= 3
    edge = np.array([np.nan, -87.5, -200.0, -np.inf], np.float32)
    out = np.empty_like(edge)
    exp_all(edge, out)
    assert np.isnan(out[0]) and (out[1:] > 0).all() and (out[1:] < 2e-38).all()


OTHER_TARGET = """
import json, sys
import numpy as np
from s2core_numpy import attention, ops
case = np.load(sys.argv[1])
q, k, v = case["q"], case["k"], case["v"]
whole = ops.Keys(None, (k, v), k.shape[1])
parts = ops.Keys((k[:, :5], v[:, :5]), (k[:, 5:], v[:, 5:]), k.shape[1] - 5)
out = attention.attend_last(q, whole, 0.125)
print(json.dumps({"lanes": attention.LANES, "score_rows": attention.SCORE_ROWS,
                  "columns": attention.COLUMNS, "out": out.tolist(),
                  "same_split": bool(np.array_equal(out, attention.attend_last(q, parts, 0.125)))}))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the targets named are x86 ones")
@pytest.mark.parametrize("cpu,lanes", [("haswell", 8), ("generic", 4)])
def test_other_vector_widths_equal_the_float64_reference(tmp_path, cpu, lanes):
    """The kernel compiled for a Haswell (8 lanes, 16 registers) and for a generic x86
    (4 lanes, no F16C: float16 widened by the bit trick on every lane; no FMA), in a
    subprocess: the float64 result within float32 rounding, an infinity in an f16 V row
    where float64 has it, and a split of the positions the bits of the whole."""
    rng = np.random.default_rng(5)
    k, v = context(2, 45, 72, np.float16, seed=6)
    v[0, 3, 10] = np.inf
    q = rng.standard_normal((1, 6, 72), dtype=np.float32)
    np.savez(tmp_path / "case.npz", q=q, k=k, v=v)
    env = dict(os.environ, NUMBA_CPU_NAME=cpu,
               NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"),  # not this CPU's cached code
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "backends"),
                                           os.environ.get("PYTHONPATH", "")]))
    if cpu == "haswell":
        env["NUMBA_CPU_FEATURES"] = HASWELL
    run = subprocess.run([sys.executable, "-c", OTHER_TARGET, str(tmp_path / "case.npz")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["lanes"] == lanes and result["same_split"]
    got = np.array(result["out"])
    ref = ops.causal_attention(q.astype(np.float64), k.astype(np.float64),
                               v.astype(np.float64), 44, 0.125)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(got), finite) and np.isinf(ref).sum() == 3
    assert rel_err(got[finite], ref[finite]) < 2e-6
