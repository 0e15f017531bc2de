"""The core's side of batching (s2core.serving.batching) and the scheduler (s2core.serving): their
checks, state after a failure, and the one-slot fallback. The numbers of every backend are
the kit's (s2core/kit/batching.py)."""

from __future__ import annotations

import numpy as np
import pytest

import s2core
from s2core.serving.batching import BatchedModel
from s2core.errors import CacheOverflowError, InvalidInputError, ModelBusyError
from s2core.generation.loop import GenerationConfig, generate
from s2core.kit.batching_rules import voice_prefix
from s2core.serving import FAILED, Server, generate_many
from s2core.kit.prompts import mixed_prompt
from s2core.embedded.writer import tiny_hparams

IM_END = 199  # a text id of the tiny model (semantic ids are 160..191)


def greedy(n: int) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=n, min_tokens_before_end=n, im_end_id=IM_END,
                            temperature=0, seed=0)


def prompts(k: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [mixed_prompt(tiny_hparams(), 8 + 3 * i, rng) for i in range(k)]


@pytest.fixture
def model(tiny_model):
    m = s2core.load(tiny_model, backend="numpy")
    yield m
    m.close()


def test_init_slots_checks(model):
    b = BatchedModel(model)
    cap = model.capabilities.max_batch_sequences
    for n_slots, max_seq_len, check in ((0, 8, "n_slots_range"), (cap + 1, 8, "n_slots_range"),
                                        (True, 8, "n_slots_type"), (2, 0, "max_seq_len_range"),
                                        (2, 1.5, "max_seq_len_type"),
                                        (2, model.hparams.context_length + 1,
                                         "max_seq_len_range")):
        with pytest.raises(InvalidInputError) as info:
            b.init_slots(n_slots, max_seq_len)
        assert info.value.check == check
        assert b.max_seq_len is None and b.n_slots == 0
    with pytest.raises(InvalidInputError):
        BatchedModel("not a model")


def test_a_second_batched_model_cannot_take_the_first_ones_slots(model):
    """The backend holds one set of slots: a second BatchedModel on the same model is refused
    while the first holds them, and its free_slots() leaves the first's alone."""
    first, second = BatchedModel(model), BatchedModel(model)
    first.init_slots(2, 32)
    p = prompts(2)
    first.eval([(0, p[0]), (1, p[1])])
    snapshot = first.kv_slot_snapshot(1)
    with pytest.raises(ModelBusyError, match=r"another BatchedModel .* holds the backend's KV "
                       r"slots \(2 slots, n_past=\[8, 11\]\)"):
        second.init_slots(4, 16)
    second.free_slots()  # holds nothing: must not drop the first's slots
    assert [first.n_past(s) for s in range(2)] == [8, 11]
    for a, b in zip(first.kv_slot_snapshot(1), snapshot):
        np.testing.assert_array_equal(a, b)
    first.eval([(0, p[1][:1])])  # the first still computes on its slots
    first.free_slots()
    second.init_slots(4, 16)  # free now
    assert second.n_slots == 4


def test_a_second_server_on_a_busy_model_is_refused_and_the_first_finishes_unharmed(model):
    p = prompts(3)
    with Server(model, max_sequences=2) as first:
        requests = [first.submit(p[i], greedy(4)) for i in range(2)]
        first.step()  # both requests hold slots now
        with pytest.raises(ModelBusyError, match="another BatchedModel"):
            generate_many(model, [p[2]], greedy(4))
        first.run()
    for request, prompt in zip(requests, p):
        np.testing.assert_array_equal(request.codes(), generate(model, prompt, greedy(4)))


def test_a_failing_backend_call_leaves_every_slot_as_it_was(model, monkeypatch):
    b = BatchedModel(model)
    b.init_slots(2, 32)
    p = prompts(2)
    b.eval([(0, p[0]), (1, p[1])])
    before = [b.n_past(s) for s in range(2)]

    def boom(batches):
        raise MemoryError("out of memory in the middle of a call")
    monkeypatch.setattr(model.backend, "eval_slots", boom)
    with pytest.raises(MemoryError):
        b.eval([(0, p[0][:2]), (1, p[1][:1])])
    assert [b.n_past(s) for s in range(2)] == before
    monkeypatch.undo()
    # the next call continues each slot where it was, as a fresh run would
    r = b.eval([(0, p[1][:3])])[0]
    model2 = s2core.load(model.model_file.path, backend="numpy")
    model2.init_kv_cache(32)
    model2.prefill_fast(p[0])
    expected = model2.prefill_fast(p[1][:3]).logits  # float32 weights: BLAS rounding only
    np.testing.assert_allclose(r.logits, expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    model2.close()


def test_server_checks_before_anything_runs(model):
    cap = model.capabilities.max_batch_sequences
    for bad in (0, cap + 1, True, 1.0):
        with pytest.raises(InvalidInputError) as info:
            Server(model, max_sequences=bad)
        assert info.value.check == "max_sequences"
    with Server(model, max_sequences=2, max_seq_len=20) as server:
        with pytest.raises(CacheOverflowError) as info:
            server.submit(prompts(1)[0], greedy(13))  # 8 + 13 > 20
        assert info.value.check == "capacity"
        with pytest.raises(InvalidInputError) as info:
            server.submit(prompts(1)[0], GenerationConfig(im_end_id=10**9))
        assert info.value.check == "im_end_id"
        assert not server.busy
    with pytest.raises(InvalidInputError) as info:
        generate_many(model, [])
    assert info.value.check == "prompts"
    with pytest.raises(InvalidInputError) as info:
        generate_many(model, prompts(2), [greedy(2)])
    assert info.value.check == "config"


def test_a_backend_error_fails_the_running_requests_and_keeps_the_waiting(model, monkeypatch):
    ps = prompts(3)
    alone = generate(model, ps[2], greedy(3))
    server = Server(model, max_sequences=2)
    reqs = [server.submit(p, greedy(3)) for p in ps]
    server.step()
    real = model.backend.eval_slots
    monkeypatch.setattr(model.backend, "eval_slots",
                        lambda batches: (_ for _ in ()).throw(RuntimeError("device lost")))
    with pytest.raises(RuntimeError):
        server.step()
    for r in reqs[:2]:
        assert r.done and r.stats.stopped_by == FAILED
        with pytest.raises(RuntimeError):
            r.codes()
    monkeypatch.setattr(model.backend, "eval_slots", real)
    server.run()
    np.testing.assert_array_equal(reqs[2].codes(), alone)
    server.close()


def test_slots_are_reused_and_the_server_resizes_when_idle(model):
    ps = prompts(5)
    config = greedy(2)
    with Server(model, max_sequences=2) as server:
        reqs = [server.submit(p, config) for p in ps]
        server.run()
        assert server.batched.n_slots == 2
        for p, r in zip(ps, reqs):
            np.testing.assert_array_equal(r.codes(), generate(model, p, config))
        big = server.submit(ps[0], greedy(30))  # needs more than the slots hold: resized
        assert len(big.codes()[0]) == 30


def test_the_one_slot_fallback_on_a_backend_without_batching(tiny_model):
    m = s2core.load(tiny_model, backend="example")
    assert m.capabilities.max_batch_sequences == 1
    ps = prompts(3)
    with pytest.raises(InvalidInputError):
        Server(m, max_sequences=2)
    many = generate_many(m, ps, greedy(3), max_sequences=4)  # clamped to one at a time
    for p, codes in zip(ps, many):
        np.testing.assert_array_equal(codes, generate(m, p, greedy(3)))
    m.close()


def test_a_raising_callback_fails_its_request_only(model):
    ps = prompts(3)
    config = greedy(4)

    def on_frame(i, frame):
        if i == 1:
            raise ZeroDivisionError("the caller's bug")
    with Server(model, max_sequences=3) as server:
        reqs = [server.submit(p, config, on_frame=on_frame if k == 1 else None)
                for k, p in enumerate(ps)]
        server.run()
        assert reqs[1].stats.stopped_by == FAILED and len(reqs[1].frames) == 2
        with pytest.raises(ZeroDivisionError):
            reqs[1].codes()
        for k in (0, 2):
            np.testing.assert_array_equal(reqs[k].codes(), generate(model, ps[k], config))


def test_batched_model_follows_the_model_guard(tiny_model):
    from s2core.errors import ModelClosedError
    m = s2core.load(tiny_model, backend="numpy")
    b = BatchedModel(m)
    b.init_slots(2, 16)
    b.eval([(0, prompts(1)[0])])
    m.close()
    with pytest.raises(ModelClosedError):
        b.eval([(1, prompts(1)[0])])
    b.free_slots()  # allowed: nothing left to free
    b.close()
    assert b.max_seq_len is None


# ---------------------------------------------------------------------- voice memory
class _Limited:
    """A NumPy backend on a machine with `limit` bytes for its KV memory (what
    kv_cache_limit_bytes() says on a smaller machine)."""

    def __new__(cls, model_file, limit):
        from s2core_numpy.backend import NumpyBackend

        class LimitedNumpy(NumpyBackend):
            def kv_cache_limit_bytes(self):
                return self.limit
        backend = LimitedNumpy(model_file)
        backend.limit = limit
        return backend



def _limited_model(path, limit=None):
    from s2core.modelfile.file import ModelFile
    from s2core.runtime.model import SlowARModel
    mf = ModelFile(path)
    return SlowARModel(mf, _Limited(mf, limit))


def test_a_voice_beyond_the_memory_limit_is_refused_and_nothing_changes(tiny_model):
    """A shared voice's K/V count against kv_cache_limit_bytes() with the slots and the
    voices already held: the voice that does not fit raises CacheAllocationError naming the
    bytes and the limit, and the slots, their n_past and K/V and the voice held are as they
    were and go on as before."""
    from s2core.errors import CacheAllocationError
    from s2core.runtime.memory import backend_kv_cache_bytes

    m = _limited_model(tiny_model)
    hp, caps = m.hparams, m.capabilities
    assert caps.shares_kv_prefix
    ps = prompts(4, seed=5)
    voice_a, voice_b = voice_prefix(m, ps[0][:10]), voice_prefix(m, ps[1][:12])
    slots = 2 * backend_kv_cache_bytes(hp, 16, caps)
    a_bytes, b_bytes = (backend_kv_cache_bytes(hp, v.n_positions, caps) for v in (voice_a, voice_b))
    m.backend.limit = slots + a_bytes + b_bytes - 1  # room for one of the two voices
    b = BatchedModel(m)
    b.init_slots(2, 16)
    assert b.restore_prefix(0, voice_a) == "shared"
    b.eval([(0, ps[2][:5]), (1, ps[3][:7])])
    before = [(b.n_past(s), b.shared_positions(s), b.kv_slot_snapshot(s)) for s in range(2)]
    with pytest.raises(CacheAllocationError) as info:
        b.restore_prefix(1, voice_b)
    text = str(info.value)
    assert f"restore_prefix(1, a voice prefix of {voice_b.n_positions} positions)" in text, text
    assert f"({b_bytes} bytes)" in text and f"({slots + a_bytes} bytes)" in text, text
    assert f"({m.backend.limit} bytes)" in text and "nothing changed" in text, text
    for s, (n, shared, (k, v)) in enumerate(before):
        assert (b.n_past(s), b.shared_positions(s)) == (n, shared)
        k2, v2 = b.kv_slot_snapshot(s)
        np.testing.assert_array_equal(k2, k)
        np.testing.assert_array_equal(v2, v)
    assert len(m.backend._slots.prefixes) == 1  # the backend was not asked to hold it
    # the held voice still serves another slot (it adds nothing), and the slots go on as
    # slots that never saw the refusal
    after = b.eval([(0, ps[2][5:8]), (1, ps[3][7:8])])
    fresh = BatchedModel(_limited_model(tiny_model))
    fresh.init_slots(2, 16)
    fresh.restore_prefix(0, voice_a)
    fresh.eval([(0, ps[2][:5]), (1, ps[3][:7])])
    again = fresh.eval([(0, ps[2][5:8]), (1, ps[3][7:8])])
    for r, ref in zip(after, again):
        np.testing.assert_array_equal(r.logits, ref.logits)
    b.reset_slot(1)
    assert b.restore_prefix(1, voice_a) == "shared"
    # exactly at the limit it fits
    m.backend.limit += 1
    b.reset_slot(1)
    assert b.restore_prefix(1, voice_b) == "shared"
    assert len(m.backend._slots.prefixes) == 2
    b.close()
    fresh.close()
    m.close()


def test_a_failed_voice_allocation_is_a_cache_allocation_error(tiny_model, monkeypatch):
    """The backend's own MemoryError while holding a voice becomes CacheAllocationError
    naming the bytes; the slot keeps what it had."""
    from s2core.errors import CacheAllocationError

    m = s2core.load(tiny_model, backend="numpy")
    ps = prompts(2, seed=6)
    voice = voice_prefix(m, ps[0][:10])
    b = BatchedModel(m)
    b.init_slots(2, 16)
    b.eval([(0, ps[1][:4])])

    def no_memory(k, v):
        raise MemoryError("Unable to allocate the prefix")
    monkeypatch.setattr(m.backend, "add_kv_prefix", no_memory)
    with pytest.raises(CacheAllocationError, match=r"the allocation failed: MemoryError"):
        b.restore_prefix(0, voice)
    assert (b.n_past(0), b.shared_positions(0)) == (4, 0)
    monkeypatch.undo()  # before close(), which drops the backend's attributes
    b.close()
    m.close()


def _two_voice_server_case(tiny_model, b_rows: int):
    """A model with memory for three slots and one voice of 10 positions; requests in voice
    a (10 positions), voice b (b_rows positions), voice a; each one's codes alone."""
    from s2core.runtime.memory import backend_kv_cache_bytes

    m = _limited_model(tiny_model)
    hp, caps = m.hparams, m.capabilities
    ps = prompts(3, seed=7)  # 8, 11 and 14 rows
    rows_a, rows_b = ps[1][:10], ps[2][:b_rows]
    voice_a, voice_b = voice_prefix(m, rows_a), voice_prefix(m, rows_b)
    config = greedy(3)
    tails = [p[:6] for p in prompts(3, seed=8)]
    asks = [(voice_a, np.vstack([rows_a, tails[0]])), (voice_b, np.vstack([rows_b, tails[1]])),
            (voice_a, np.vstack([rows_a, tails[2]]))]
    alone = [generate(m, prompt, config, prefix=v) for v, prompt in asks]
    own = 6 + config.max_new_tokens  # a slot holds the positions after its shared voice
    m.backend.limit = (3 * backend_kv_cache_bytes(hp, own, caps)
                       + backend_kv_cache_bytes(hp, 10, caps))
    return m, asks, alone, config


def test_a_request_whose_voice_does_not_fit_yet_waits_for_room(tiny_model):
    """Memory for one voice beside the slots: the request in the second voice waits until
    the first voice's requests have left (it is released then), and the request behind it
    waits its turn; all give generate()'s codes."""
    m, asks, alone, config = _two_voice_server_case(tiny_model, 10)
    with Server(m, max_sequences=3) as server:
        reqs = [server.submit(prompt, config, prefix=v) for v, prompt in asks]
        server.step()
        assert reqs[0].slot is not None and reqs[1].slot is None and reqs[2].slot is None
        server.run()
        for i, r in enumerate(reqs):
            assert r.stats.prefix_shared, f"request {i}"
            np.testing.assert_array_equal(r.codes(), alone[i], err_msg=f"request {i}")
        assert len(server.batched.held_voices) == 1  # each voice was released for the next
    m.close()


def test_a_request_whose_voice_never_fits_fails_alone(tiny_model):
    """A voice larger than the room beside the slots, even with no other voice held: its
    request ends with CacheAllocationError, the others give generate()'s codes."""
    from s2core.errors import CacheAllocationError

    m, asks, alone, config = _two_voice_server_case(tiny_model, 11)
    with Server(m, max_sequences=3) as server:
        reqs = [server.submit(prompt, config, prefix=v) for v, prompt in asks]
        server.run()
        assert reqs[1].stats.stopped_by == FAILED and not reqs[1].frames
        assert [r.stats.prefix_shared for r in (reqs[0], reqs[2])] == [True, True]
        with pytest.raises(CacheAllocationError, match="restore_prefix"):
            reqs[1].codes()
        for i in (0, 2):
            np.testing.assert_array_equal(reqs[i].codes(), alone[i], err_msg=f"request {i}")
    m.close()


# ---------------------------------------------------------------------- releasing voices
def _backend_voice_positions(m) -> list[int]:
    """Positions of each voice the NumPy backend holds now (its own state, not the core's)."""
    return [pair[0].shape[2] for pair in m.backend._slots.prefixes.values()]


def test_a_long_run_serves_more_voices_than_fit_at_once(tiny_model):
    """Seven requests, each in its own voice, two slots, memory for the slots and two voices:
    every request gives generate()'s codes, and the backend never holds more voices than
    the limit allows (the idle ones are released, least recently used first)."""
    from s2core.runtime.memory import backend_kv_cache_bytes

    m = _limited_model(tiny_model)
    hp, caps = m.hparams, m.capabilities
    rng = np.random.default_rng(9)
    config = greedy(3)
    asks = []
    for i in range(7):
        rows = mixed_prompt(hp, 8 + i % 3 * 2, rng)  # voices of 8, 10 and 12 positions
        asks.append((voice_prefix(m, rows), np.vstack([rows, mixed_prompt(hp, 5, rng)])))
    alone = [generate(m, prompt, config, prefix=v) for v, prompt in asks]
    own = 5 + config.max_new_tokens
    slots = 2 * backend_kv_cache_bytes(hp, own, caps)
    m.backend.limit = slots + 2 * backend_kv_cache_bytes(hp, 12, caps)
    with Server(m, max_sequences=2) as server:
        reqs = [server.submit(prompt, config, prefix=v) for v, prompt in asks]
        while server.busy:
            server.step()
            held = sum(backend_kv_cache_bytes(hp, n, caps) for n in _backend_voice_positions(m))
            assert slots + held <= m.backend.limit, _backend_voice_positions(m)
            assert held == server.batched.held_voice_bytes
        for i, r in enumerate(reqs):
            assert r.stats.stopped_by != FAILED, r.stats
            assert r.stats.prefix_shared
            np.testing.assert_array_equal(r.codes(), alone[i], err_msg=f"request {i}")
    m.close()


def _batched_with_room(tiny_model, n_slots, voice_positions, idle_voices=8):
    """A BatchedModel of n_slots 16-position slots on a backend with room for them and
    `voice_positions` voice positions; and three voices A, B (10 positions), C (12)."""
    from s2core.runtime.memory import backend_kv_cache_bytes

    m = _limited_model(tiny_model)
    hp, caps = m.hparams, m.capabilities
    ps = prompts(3, seed=10)  # 8, 11, 14 rows
    voices = [voice_prefix(m, ps[1][:10]), voice_prefix(m, ps[2][:10]), voice_prefix(m, ps[2][:12])]
    m.backend.limit = (n_slots * backend_kv_cache_bytes(hp, 16, caps)
                       + backend_kv_cache_bytes(hp, voice_positions, caps))
    b = BatchedModel(m, idle_voices=idle_voices)
    b.init_slots(n_slots, 16)
    return m, b, voices


def test_idle_voices_are_kept_and_the_least_recently_used_makes_room(tiny_model):
    m, b, (a, bv, c) = _batched_with_room(tiny_model, 1, 22)
    for voice in (a, bv, a):  # A used again last: B is the least recently used
        b.reset_slot(0)
        assert b.restore_prefix(0, voice) == "shared"
    b.reset_slot(0)
    assert b.held_voices == (bv, a)  # both idle, kept
    assert sorted(_backend_voice_positions(m)) == [10, 10]
    assert b.restore_prefix(0, c) == "shared"  # 10 + 10 + 12 > 22: B goes, A stays
    assert b.held_voices == (a, c)
    assert sorted(_backend_voice_positions(m)) == [10, 12]
    b.eval([(0, prompts(1, seed=11)[0][:4])])  # the slot in C works as a fresh one would
    b.close()
    m.close()


def test_a_voice_refused_releases_nothing(tiny_model):
    """When releasing every idle voice would not make room, nothing is released and
    nothing changes."""
    from s2core.errors import CacheAllocationError

    m, b, (a, bv, c) = _batched_with_room(tiny_model, 2, 21)
    b.restore_prefix(0, bv)
    b.reset_slot(0)           # B idle (10 positions)
    b.restore_prefix(0, a)    # A referenced by slot 0 (10 positions)
    b.eval([(0, prompts(1, seed=12)[0][:3]), (1, prompts(1, seed=13)[0][:5])])
    before = [(b.n_past(s), b.kv_slot_snapshot(s)) for s in range(2)]
    with pytest.raises(CacheAllocationError) as info:
        b.restore_prefix(1, c)  # 10 + 12 > 21 even without B
    assert "releasing the 1 voice(s) no slot uses" in str(info.value), str(info.value)
    assert "nothing changed" in str(info.value)
    assert b.held_voices == (bv, a) and sorted(_backend_voice_positions(m)) == [10, 10]
    for s, (n, (k, v)) in enumerate(before):
        assert b.n_past(s) == n
        np.testing.assert_array_equal(b.kv_slot_snapshot(s)[0], k)
        np.testing.assert_array_equal(b.kv_slot_snapshot(s)[1], v)
    b.close()
    m.close()


@pytest.mark.parametrize("idle_voices", [0, 1])
def test_idle_voices_beyond_the_number_kept_are_released(tiny_model, idle_voices):
    m, b, voices = _batched_with_room(tiny_model, 2, 1000, idle_voices=idle_voices)
    b.restore_prefix(1, voices[0])  # referenced all along: never released
    for voice in voices[1:]:
        b.reset_slot(0)
        b.restore_prefix(0, voice)
        b.reset_slot(0)
        assert len(b.held_voices) == 1 + idle_voices
        assert b.held_voices[-1] is (voice if idle_voices else voices[0])
        assert len(_backend_voice_positions(m)) == 1 + idle_voices
    b.reset_slot(1)
    assert len(b.held_voices) == idle_voices
    with pytest.raises(InvalidInputError) as info:
        BatchedModel(m, idle_voices=-1)
    assert info.value.check == "idle_voices"
    b.close()
    m.close()


def test_generate_many_with_small_slots_gives_the_same_codes(model):
    """max_seq_len sizes each slot (the HTTP benchmark's baseline uses the engine's size):
    the same codes as slots of the whole context; a prompt that cannot fit is refused before
    any request runs."""
    ps, n = prompts(3), 5
    whole = generate_many(model, ps, greedy(n))
    fitted = generate_many(model, ps, greedy(n), max_seq_len=max(len(p) for p in ps) + n)
    for a, b in zip(whole, fitted):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(InvalidInputError):
        generate_many(model, ps, greedy(n), max_seq_len=4)
    assert [c.shape for c in generate_many(model, ps[:1], greedy(n))] == [whole[0].shape]
