"""What MLX's batching promises beyond the conformance kit (which checks the numbers of every
slot against each sequence alone): one weight product per layer for all the rows of a call,
slot caches written in place, and a voice's K/V held once however many slots start with it."""

from __future__ import annotations

import numpy as np
import pytest

import s2core
from s2core.serving import BatchedModel
from s2core.kit.batching_rules import voice_prefix
from s2core.kit.models import kit_model
from s2core.kit import backend_kv_cache_bytes
from s2core.kit.prompts import mixed_prompt, semantic_frame

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'mlx[cpu]')")

from s2core_mlx import fast_ar, slow_ar  # noqa: E402
from s2core_mlx.kv_cache import buffer_address  # noqa: E402
from s2core_mlx.plugin import MAX_BATCH_SEQUENCES, mlx_capabilities  # noqa: E402


def load(config="gqa4", weight_type="q8_0", **options):
    return s2core.load(kit_model(config, weight_type), backend="mlx", **options)


def rows_projected(monkeypatch, module) -> list[int]:
    """The row count of every QKV projection `module` makes from now on."""
    rows: list[int] = []
    inner = module.project_qkv

    def spy(x, blk, s):
        rows.append(x.shape[0])
        return inner(x, blk, s)
    monkeypatch.setattr(module, "project_qkv", spy)
    return rows


def test_mlx_declares_batching_and_shared_prefixes():
    for metal in (False, True):
        caps = mlx_capabilities(metal)
        assert caps.max_batch_sequences == MAX_BATCH_SEQUENCES > 1 and caps.shares_kv_prefix


def test_a_call_multiplies_every_slots_rows_by_each_weight_once(monkeypatch):
    """Three slots (a 9-position prefill beside two decode rows): each layer's QKV product
    sees all 11 rows in one product, not one product per slot; the Fast-AR's passes see the
    three sequences' rows together."""
    with load() as m:
        hp = m.hparams
        rng = np.random.default_rng(0)
        b = BatchedModel(m)
        b.init_slots(3, 32)
        b.eval([(1, mixed_prompt(hp, 5, rng)), (2, mixed_prompt(hp, 7, rng))])
        rows = rows_projected(monkeypatch, slow_ar)
        results = b.eval([(2, semantic_frame(hp, rng)), (0, mixed_prompt(hp, 9, rng)),
                          (1, semantic_frame(hp, rng))])
        assert rows == [11] * hp.n_layer
        assert [b.n_past(s) for s in range(3)] == [9, 6, 8]

        fast_rows = rows_projected(monkeypatch, fast_ar)
        hiddens = np.stack([r.hidden for r in results])
        for k in range(3):  # a frame's first codebooks: each call appends one position
            b.fast_decode(hiddens, np.tile([4, 2][:k], (3, 1)).astype(np.int64))
        assert fast_rows == [3] * (3 * len(m.backend.fast.layers))
        b.close()


def test_slot_caches_are_written_in_place_and_never_regrown():
    """MLX updates a slot's arrays in place only while nothing else references them: a
    reference kept across calls would copy every layer's cache on every step."""
    with load() as m:
        hp = m.hparams
        rng = np.random.default_rng(1)
        b = BatchedModel(m)
        b.init_slots(3, 40)
        slots = m.backend._slots
        arrays = [a for c in slots.caches for a in c.arrays()]
        addresses = [buffer_address(a) for a in arrays]
        del arrays
        b.eval([(0, mixed_prompt(hp, 12, rng)), (2, mixed_prompt(hp, 4, rng))])
        for _ in range(4):
            b.eval([(s, semantic_frame(hp, rng)) for s in (2, 0, 1)])
        assert m.backend._slots is slots
        arrays = [a for c in slots.caches for a in c.arrays()]
        assert [buffer_address(a) for a in arrays] == addresses
        assert all(a.shape[2] == 40 for a in arrays)
        del arrays
        b.close()


def test_slots_in_one_voice_hold_its_prefix_once():
    """Memory measured (MLX's active memory): four slots that start with one voice hold its
    K/V once and only their own positions, so a slot reaches the voice's length + its
    capacity; the voice released with its last slot gives its memory back at once."""
    with load(weight_type="f16") as m:
        hp, caps, be = m.hparams, m.capabilities, m.backend
        rng = np.random.default_rng(3)
        voice = mixed_prompt(hp, 200, rng)
        prefix = voice_prefix(m, voice)
        one_voice = backend_kv_cache_bytes(hp, len(voice), caps)
        own = 10
        b = BatchedModel(m, idle_voices=0)
        b.init_slots(4, own)
        before = mx.get_active_memory()
        assert [b.restore_prefix(s, prefix) for s in range(4)] == ["shared"] * 4
        held = mx.get_active_memory() - before
        # the voice once; copied into each slot it would be four times
        assert one_voice <= held < 1.25 * one_voice, (held, one_voice)
        assert b.held_voice_bytes == one_voice
        assert len({id(c.prefix) for c in be._slots.caches}) == 1
        assert all(a.shape[2] == own for c in be._slots.caches for a in c.arrays())
        b.eval([(s, mixed_prompt(hp, own, rng)) for s in range(4)])  # every own position
        assert [b.n_past(s) for s in range(4)] == [len(voice) + own] * 4
        k, v = b.kv_slot_snapshot(3)  # the voice's rows, then the slot's own
        assert k.shape[1] == len(voice) + own
        np.testing.assert_array_equal(k[:, :len(voice)], prefix.k)
        np.testing.assert_array_equal(v[:, :len(voice)], prefix.v)
        results_and_slots = mx.get_active_memory()
        for s in range(4):
            b.reset_slot(s)  # idle_voices=0: the voice is released with its last slot
        assert not be._slots.prefixes and all(c.prefix is None for c in be._slots.caches)
        freed = results_and_slots - mx.get_active_memory()
        assert freed >= 0.9 * one_voice, (freed, one_voice)
        assert mx.get_cache_memory() < one_voice  # handed back, not kept in MLX's pool
        b.close()


# A server driven from worker threads, in a child process so that a crash (at exit too: MLX
# aborts a process whose threads left streams of their own behind) fails the test, not the run.
SERVED_FROM_THREADS = """
import sys, threading, numpy as np, s2core
from s2core.generation import generate
from s2core.kit.batching_rules import greedy, sequences, voice_prefix
from s2core.serving import generate_many
m = s2core.load(sys.argv[1], backend="mlx")
prompts = [p for p, _ in sequences(seed=5)]
prefix = voice_prefix(m, prompts[0][:6])
configs = [greedy(3 + i, min_tokens_before_end=3 + i) for i in range(len(prompts))]
voices = [prefix, None, None, None]
prompts[0] = np.vstack([prompts[0][:6], prompts[0]])
alone = [generate(m, p, c, prefix=v) for p, c, v in zip(prompts, configs, voices)]
out = {}
def serve(key):
    out[key] = generate_many(m, prompts, configs, max_sequences=4, prefixes=voices)
for i in range(2):  # one after the other: a model serves one BatchedModel at a time
    t = threading.Thread(target=serve, args=(i,)); t.start(); t.join()
for many in out.values():
    for a, g in zip(alone, many):
        assert np.array_equal(a, g), (a, g)
print("ok", len(out))
"""


def test_a_server_in_worker_threads_gives_generates_codes_and_exits_cleanly():
    import subprocess
    import sys
    model = kit_model("gqa4", "q8_0")
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", SERVED_FROM_THREADS, str(model)],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and "ok 2" in run.stdout, (run.returncode,
                                                               run.stderr[-2000:])
