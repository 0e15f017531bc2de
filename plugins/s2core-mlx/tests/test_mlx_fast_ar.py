"""The incremental Fast-AR: a frame's calls reuse the K/V of the positions before them
(fast_begin / fast_extend), process only their new position, and give fast_decode's numbers."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import s2core
from s2core.plugin import FastHparams
from s2core.kit.conformance import rel_err
from s2core.kit.models import kit_model
from s2core.kit import tiny_hparams, write_model

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'mlx[cpu]')")

from s2core_mlx import fast_ar  # noqa: E402
from s2core_mlx.fast_ar import FastState  # noqa: E402

#: incremental against from-scratch: float32 summation order only (the kit's bound is 1e-5)
SAME = 2e-6
CASES = [("gqa2-noqk", "f32"), ("gqa4", "q8_0"), ("mha-k", "q4_k")]


class Spy:
    """Records the backend's Fast-AR calls and the rows each layer stack processes."""

    def __init__(self, monkeypatch, backend):
        self.calls: list[tuple[str, int, int]] = []  # (hook, positions before, after)
        self.rows: list[int] = []  # rows of x entering each Fast-AR layer
        begin, start, extend = backend.fast_begin, backend.fast_start, backend.fast_extend

        def spy_begin(hidden):
            state, logits = begin(hidden)
            self.calls.append(("begin", 0, state.n_positions))
            return state, logits

        def spy_start(hidden, codes):
            state, logits = start(hidden, codes)
            self.calls.append(("start", 0, state.n_positions))
            return state, logits

        def spy_extend(state, codes):
            before = state.n_positions
            new, logits = extend(state, codes)
            self.calls.append(("extend", before, new.n_positions))
            return new, logits

        monkeypatch.setattr(backend, "fast_begin", spy_begin)
        monkeypatch.setattr(backend, "fast_start", spy_start)
        monkeypatch.setattr(backend, "fast_extend", spy_extend)
        inner = fast_ar.attention_inputs

        def spy_attention_inputs(x, blk, s, first_position):
            self.rows.append(x.shape[0])
            return inner(x, blk, s, first_position)
        monkeypatch.setattr(fast_ar, "attention_inputs", spy_attention_inputs)


@pytest.mark.parametrize("config,weight_type", CASES)
def test_a_frame_reuses_the_state(monkeypatch, config, weight_type):
    # the spies are undone before close() releases the backend
    with s2core.load(kit_model(config, weight_type), backend="mlx") as m, \
            monkeypatch.context() as patch:
        hp = m.hparams
        assert m.backend.incremental_fast_decode
        spy = Spy(patch, m.backend)
        rng = np.random.default_rng(0)
        h = rng.standard_normal(hp.dim).astype(np.float32)
        codes = rng.integers(0, hp.codebook_size, hp.num_codebooks - 1)
        for n in range(hp.num_codebooks):  # the frame: prefixes 0 .. C-1
            out = m.fast_decode(h, codes[:n])
            full = np.array(m.backend.fast_decode(h, codes[:n]))  # from scratch, not spied
            assert rel_err(out, full) < SAME, f"prefix {n}"
        # One start (position 0 alone), then one extend per code: each adds one position.
        assert spy.calls == [("start", 0, 1)] + [("extend", n, n + 1)
                                            for n in range(1, hp.num_codebooks)]
        # Each incremental call ran every layer on its one new row; the from-scratch calls
        # (interleaved) ran on n + 1 rows.
        n_layer = hp.fast.n_layer
        per_call = [spy.rows[i:i + n_layer] for i in range(0, len(spy.rows), n_layer)]
        incremental, scratch = per_call[0::2], per_call[1::2]
        assert incremental == [[1] * n_layer] * hp.num_codebooks
        assert scratch == [[n + 1] * n_layer for n in range(hp.num_codebooks)]


def test_state_holds_float32_kv_of_every_position():
    with s2core.load(kit_model("gqa2-noqk", "f32"), backend="mlx") as m:
        f = m.hparams.fast
        h = np.ones(m.hparams.dim, np.float32)
        state, _ = m.backend.fast_begin(h)
        state, _ = m.backend.fast_extend(state, np.array([3, 5, 7]))
        assert isinstance(state, FastState) and state.n_positions == 4
        assert len(state.keys) == len(state.values) == f.n_layer
        for a in state.arrays():
            assert a.shape == (1, f.n_head_kv, 4, f.head_dim) and a.dtype == mx.float32


@pytest.mark.parametrize("config,weight_type", CASES)
def test_several_codes_at_once_and_branches(config, weight_type):
    """extend by three codes in one call, and from an earlier state twice (the old state is
    left as it was): every result equals the from-scratch one."""
    with s2core.load(kit_model(config, weight_type), backend="mlx") as m:
        b = m.backend
        h = np.random.default_rng(1).standard_normal(m.hparams.dim).astype(np.float32)
        s0, first = b.fast_begin(h)
        assert rel_err(np.array(first), np.array(b.fast_decode(h, np.zeros(0, np.int64)))) < SAME
        s3, out = b.fast_extend(s0, np.array([2, 0, 1]))
        assert s0.n_positions == 1 and s3.n_positions == 4
        assert rel_err(np.array(out), np.array(b.fast_decode(h, np.array([2, 0, 1])))) < SAME
        for branch in ([3], [1, 1]):
            _, out = b.fast_extend(s0, np.array(branch))
            assert rel_err(np.array(out), np.array(b.fast_decode(h, np.array(branch)))) < SAME
        _, out = b.fast_extend(s3, np.array([3]))
        assert rel_err(np.array(out), np.array(b.fast_decode(h, np.array([2, 0, 1, 3])))) < SAME


def test_native_hidden_continues_the_frame(monkeypatch):
    """The generation loop hands Result.hidden_native over: the same array continues the
    frame (compared by value), a new result starts a new one."""
    with s2core.load(kit_model("gqa4", "f32"), backend="mlx") as m, \
            monkeypatch.context() as patch:
        spy = Spy(patch, m.backend)
        m.init_kv_cache(32)
        r = m.prefill(np.array([[1] + [0] * m.hparams.num_codebooks] * 3))
        for n in range(4):
            m.fast_decode_native(r.hidden_native, list(range(n)))
        r2 = m.step([m.hparams.semantic_begin_id] + [1] * m.hparams.num_codebooks)
        m.fast_decode_native(r2.hidden_native, [])
        m.fast_decode_native(r2.hidden_native, [4])
        assert [c[0] for c in spy.calls] == ["start", "extend", "extend", "extend",
                                             "start", "extend"]


@pytest.mark.parametrize("config,weight_type", CASES)
def test_a_frame_that_starts_with_a_code_runs_both_positions_in_one_pass(monkeypatch, config,
                                                                          weight_type):
    """The generation loop's first call of a frame has one code: position 0 and that code
    go through the layers together (each weight read once for both rows), with fast_decode's
    numbers, and the frame goes on from there."""
    with s2core.load(kit_model(config, weight_type), backend="mlx") as m, \
            monkeypatch.context() as patch:
        hp = m.hparams
        spy = Spy(patch, m.backend)
        rng = np.random.default_rng(5)
        h = rng.standard_normal(hp.dim).astype(np.float32)
        codes = rng.integers(0, hp.codebook_size, 3)
        for n in (1, 2, 3):
            out = m.fast_decode(h, codes[:n])
            assert rel_err(out, np.array(m.backend.fast_decode(h, codes[:n]))) < SAME, n
        assert spy.calls == [("start", 0, 2), ("extend", 2, 3), ("extend", 3, 4)]
        n_layer = hp.fast.n_layer
        assert spy.rows[:n_layer] == [2] * n_layer  # both positions in one pass


def test_incremental_frame_matches_recompute_on_s2_shaped_layers(tmp_path):
    """A Fast-AR as wide as S2 Pro's per head (head_dim 128, GQA 4, rope base 1e6) but small:
    the incremental path's positions and RoPE offsets hold for every prefix length."""
    hp = replace(tiny_hparams(), fast=FastHparams(
        context_length=11, dim=256, ffn=256, n_layer=2, n_head=8, n_head_kv=2, head_dim=128,
        rope_freq_base=1e6, attention_qk_norm=False, project_in=True))
    path = write_model(tmp_path / "wide.gguf", hp, "f32").path
    with s2core.load(path, backend="mlx") as m:
        h = np.random.default_rng(2).standard_normal(hp.dim).astype(np.float32)
        codes = np.arange(hp.num_codebooks - 1) % hp.codebook_size
        for n in range(hp.num_codebooks):
            out = m.fast_decode(h, codes[:n])
            assert rel_err(out, np.array(m.backend.fast_decode(h, codes[:n]))) < SAME
