"""The generation loop (SPEC 6): against a direct transcription, its checks, its stream."""

from __future__ import annotations

import numpy as np
import pytest

import s2core
from s2core.errors import CacheOverflowError, InvalidInputError, InvalidTokensError, S2CoreError
from s2core.generation.loop import (GenerationConfig, GenerationStats, Sampling, generate,
                               sample_token, stream)
from s2core.kit.prompts import mixed_prompt
from s2core.embedded.writer import tiny_hparams, write_model

IM_END = 199  # a text id of the tiny model (semantic ids are 160..191)
CONFIG = GenerationConfig(im_end_id=IM_END)


@pytest.fixture
def model(tiny_model):
    m = s2core.load(tiny_model, backend="numpy")
    yield m
    m.close()


def prompt_rows(n: int = 20, seed: int = 0) -> np.ndarray:
    return mixed_prompt(tiny_hparams(), n, np.random.default_rng(seed))


def spec6_generate(m, prompt, max_new_tokens, temperature, top_p, top_k, min_tokens_before_end,
                   im_end_id, rng) -> np.ndarray:
    """SPEC 6's loop written out, sampling over the whole vocabulary with the -inf mask."""
    hp = m.hparams
    mask = np.full(hp.vocab_size, -np.inf, np.float32)
    mask[hp.semantic_begin_id:hp.semantic_end_id + 1] = 0
    mask[im_end_id] = 0

    def sample_main(logits, frames, t, p):
        biased = logits + mask
        if frames < min_tokens_before_end:
            biased[im_end_id] = -np.inf
        return sample_token(biased, temperature=t, top_p=p, top_k=top_k, rng=rng)

    m.init_kv_cache(len(prompt) + max_new_tokens)
    r = m.prefill_fast(prompt)
    main = sample_main(r.logits, 0, temperature, top_p)
    window, out = [], []
    while main != im_end_id and len(out) < max_new_tokens:
        if main in window and hp.semantic_begin_id <= main <= hp.semantic_end_id:
            main = sample_main(r.logits, len(out), 1.0, 0.9)
        window = (window + [main])[-10:]
        codes = [min(max(main - hp.semantic_begin_id, 0), hp.codebook_size - 1)]
        for _ in range(1, hp.num_codebooks):
            codes.append(sample_token(m.fast_decode(r.hidden, codes), temperature=temperature,
                                      top_p=top_p, top_k=top_k, rng=rng))
        out.append(codes)
        r = m.step([main] + codes)
        main = sample_main(r.logits, len(out), temperature, top_p)
    m.clear_kv_cache()
    return np.array(out, dtype=np.int64).T.reshape(hp.num_codebooks, -1)


@pytest.mark.parametrize("seed,settings", [
    (0, dict(temperature=0.8, top_p=0.8, top_k=30)),
    (1, dict(temperature=1.0, top_p=1.0, top_k=0)),
    (2, dict(temperature=0.0, top_p=0.8, top_k=30)),  # greedy: RAS is what varies it
    (3, dict(temperature=1.3, top_p=0.95, top_k=5)),
])
def test_loop_matches_a_transcription_of_spec6(model, seed, settings):
    prompt = prompt_rows()
    config = GenerationConfig(max_new_tokens=24, im_end_id=IM_END, seed=seed,
                              min_tokens_before_end=3, **settings)
    codes = generate(model, prompt, config)
    expected = spec6_generate(model, prompt, 24, settings["temperature"], settings["top_p"],
                              settings["top_k"], 3, IM_END, np.random.default_rng(seed))
    np.testing.assert_array_equal(codes, expected)
    assert codes.shape[0] == model.hparams.num_codebooks and codes.shape[1] >= 3


def test_generate_produces_valid_frames_and_frees_the_cache(model):
    hp = tiny_hparams()
    stats = GenerationStats()
    seen = []
    config = GenerationConfig(max_new_tokens=6, im_end_id=IM_END, min_tokens_before_end=6, seed=0)
    codes = generate(model, prompt_rows(), config, on_frame=lambda i, c: seen.append(i),
                     stats=stats)
    assert codes.shape == (hp.num_codebooks, 6) and codes.dtype == np.int64
    assert ((codes >= 0) & (codes < hp.codebook_size)).all()
    assert seen == list(range(6)) and len(stats.step_s) == 5 and len(stats.fast_decode_s) == 6
    assert stats.frames == 6 and stats.stopped_by == "max_new_tokens"
    assert stats.prompt_positions == stats.prefilled_positions == 20
    assert 0 < stats.first_frame_s <= stats.total_s
    assert model.max_seq_len is None  # cleared at the end of the synthesis
    np.testing.assert_array_equal(codes, generate(model, prompt_rows(), config))  # seeded


def test_unseeded_runs_differ_and_default_settings_are_s2cpp():
    c = GenerationConfig()
    assert (c.max_new_tokens, c.temperature, c.top_p, c.top_k, c.min_tokens_before_end,
            c.seed, c.ras_window) == (1024, 0.8, 0.8, 30, 0, None, 10)
    assert c.codes == c.main == Sampling(0.8, 0.8, 30) and c.ras == Sampling(1.0, 0.9, 30)


def test_on_frame_false_stops(model):
    config = GenerationConfig(max_new_tokens=10, im_end_id=IM_END, min_tokens_before_end=10)
    codes = generate(model, prompt_rows(), config, on_frame=lambda i, c: i < 2)
    assert codes.shape[1] == 3 and model.max_seq_len is None


def test_stops_at_im_end_and_min_tokens_blocks_it(model):
    hp = tiny_hparams()
    prompt = prompt_rows()
    model.init_kv_cache(32)
    logits = model.prefill_fast(prompt).logits
    model.clear_kv_cache()
    # Declare the id greedy picks first to be <|im_end|>: the loop must stop at once...
    first = int(hp.semantic_begin_id + np.argmax(logits[hp.semantic_begin_id:hp.semantic_end_id + 1]))
    stats = GenerationStats()
    codes = generate(model, prompt, GenerationConfig(max_new_tokens=5, im_end_id=first,
                                                     temperature=0), stats=stats)
    assert codes.shape == (hp.num_codebooks, 0) and stats.stopped_by == "im_end"
    # ...unless min_tokens_before_end forbids ending yet.
    codes = generate(model, prompt, GenerationConfig(max_new_tokens=3, im_end_id=first,
                                                     temperature=0, min_tokens_before_end=3))
    assert codes.shape == (hp.num_codebooks, 3)
    assert codes[0, 0] != first - hp.semantic_begin_id


def test_ras_window_zero_is_off(model):
    """Greedy with RAS off is plain argmax at every step; with RAS on, a repeated token is
    resampled at temperature 1 (the tiny model repeats itself within 10 frames)."""
    hp = tiny_hparams()
    prompt = prompt_rows()
    off = generate(model, prompt, GenerationConfig(max_new_tokens=16, im_end_id=IM_END,
                                                   temperature=0, ras_window=0,
                                                   min_tokens_before_end=16, seed=0))
    on = generate(model, prompt, GenerationConfig(max_new_tokens=16, im_end_id=IM_END,
                                                  temperature=0, min_tokens_before_end=16,
                                                  seed=0))
    # the argmax loop by hand
    model.init_kv_cache(len(prompt) + 16)
    r = model.prefill_fast(prompt)
    sem = slice(hp.semantic_begin_id, hp.semantic_end_id + 1)
    mains = []
    for _ in range(16):
        main = hp.semantic_begin_id + int(np.argmax(r.logits[sem]))
        codes = [main - hp.semantic_begin_id]
        for _ in range(1, hp.num_codebooks):
            codes.append(int(np.argmax(model.fast_decode(r.hidden, codes))))
        mains.append(main)
        r = model.step([main] + codes)
    model.clear_kv_cache()
    np.testing.assert_array_equal(off[0] + hp.semantic_begin_id, mains)
    assert len(set(mains)) < len(mains)  # greedy repeated itself: RAS had work to do
    assert not np.array_equal(on, off)


def test_flat_prompt_is_sized_by_positions(tmp_path):
    """A flat token-major prompt holds n x (C+1) integers but n positions: the cache is sized
    by n (it used to be sized by the integer count and refused prompts that fit)."""
    hp = tiny_hparams()
    prompt = prompt_rows(20)
    path = tmp_path / "short-context.gguf"  # a model whose context is exactly 20 + 8
    write_model(path, tiny_hparams(context_length=20 + 8), "f32", seed=3)
    small = s2core.load(path, backend="numpy")
    config = GenerationConfig(max_new_tokens=8, im_end_id=IM_END, seed=0, min_tokens_before_end=8)
    flat = generate(small, prompt.ravel(), config)
    np.testing.assert_array_equal(flat, generate(small, prompt, config))
    assert flat.shape == (hp.num_codebooks, 8)
    with pytest.raises(CacheOverflowError) as info:
        generate(small, prompt.ravel(), GenerationConfig(max_new_tokens=9, im_end_id=IM_END))
    assert info.value.check == "context_length"
    small.close()


@pytest.mark.parametrize("call,check", [
    (lambda m, p: generate(m, None), "prompt"),
    (lambda m, p: generate(m, p, GenerationConfig(im_end_id=500)), "im_end_id"),
    (lambda m, p: generate(m, p[:0], CONFIG), "n_tokens>0"),
    (lambda m, p: generate(m, p.astype(np.float32), CONFIG), "dtype"),
    (lambda m, p: generate(m, np.r_[p[:3].ravel(), 1], CONFIG), "flat_length"),
    (lambda m, p: generate(m, p, GenerationConfig(im_end_id=IM_END, max_new_tokens=5000)),
     "context_length"),
    (lambda m, p: generate(m, p, {"max_new_tokens": 3}), "config"),
    (lambda m, p: generate(None, p), "model"),
    (lambda m, p: generate(m, p, CONFIG, prefix="not a prefix"), "prefix_type"),
])
def test_failing_generate_leaves_the_callers_cache(model, call, check):
    """Every check runs before the model is touched: the caller's cache and n_past survive."""
    prompt = prompt_rows()
    model.init_kv_cache(50)
    model.prefill(prompt[:7])
    k, _ = model.kv_cache_snapshot()
    with pytest.raises(S2CoreError) as info:
        call(model, prompt)
    assert isinstance(info.value, InvalidInputError) and info.value.check == check
    assert model.max_seq_len == 50 and model.n_past == 7
    np.testing.assert_array_equal(model.kv_cache_snapshot()[0], k)


@pytest.mark.parametrize("kwargs,check", [
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=float("nan")), "top_p"),
    (dict(top_k=1.5), "top_k"),
    (dict(seed=-1), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=True), "max_new_tokens"),
    (dict(min_tokens_before_end=-1), "min_tokens_before_end"),
    (dict(ras_window=-1), "ras_window"),
    (dict(ras_temperature=float("nan")), "ras.temperature"),
    (dict(im_end_id=-5), "im_end_id"),
    (dict(code_sampling=(1.0, 0.9, 3)), "code_sampling"),
])
def test_bad_config_is_an_s2core_error_naming_the_check(kwargs, check):
    with pytest.raises(InvalidInputError) as info:
        GenerationConfig(**kwargs)
    assert info.value.check == check
    with pytest.raises(InvalidInputError):
        Sampling(temperature=float("nan"))


def test_stream_yields_frames_and_frees_on_break_exception_and_interrupt(model):
    prompt = prompt_rows()
    config = GenerationConfig(max_new_tokens=8, im_end_id=IM_END, min_tokens_before_end=8, seed=3)
    full = generate(model, prompt, config)
    frames = []
    for frame in stream(model, prompt, config):
        assert model.max_seq_len == len(prompt) + 8  # the cache lives while the stream runs
        frames.append(frame)
        if len(frames) == 3:
            break
    assert model.max_seq_len is None  # freed on break (the generator was closed)
    np.testing.assert_array_equal(np.stack(frames, axis=1), full[:, :3])

    with pytest.raises(RuntimeError):
        for _ in stream(model, prompt, config):
            raise RuntimeError("consumer failed")
    assert model.max_seq_len is None

    with pytest.raises(KeyboardInterrupt):
        generate(model, prompt, config, on_frame=lambda i, c: (_ for _ in ()).throw(KeyboardInterrupt))
    assert model.max_seq_len is None
    np.testing.assert_array_equal(generate(model, prompt, config), full)  # still usable


def test_stream_checks_run_at_creation(model):
    with pytest.raises(InvalidTokensError):
        stream(model, prompt_rows()[:, :5], CONFIG)
    assert model.max_seq_len is None
