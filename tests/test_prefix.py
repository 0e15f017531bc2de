"""Voice prefixes across backends, the recompute fallback, the file format, the model identity."""

from __future__ import annotations

import dataclasses
import json
import struct

import numpy as np
import pytest

import s2core
from s2core.contract.backend import Backend
from s2core.errors import PrefixFileError
from s2core.modelfile.file import ModelFile
from s2core.kit.conformance import assert_close
from s2core.kit.models import CONFIGS, kit_model
from s2core.kit.tolerances import output_tolerance
from s2core.runtime.model import SlowARModel
from s2core.runtime.prefix import KVPrefix, ModelIdentity
from s2core.kit.prompts import mixed_prompt, semantic_frame
from s2core.embedded.writer import tiny_hparams, write_model
from s2core_numpy.backend import NumpyBackend

HP = CONFIGS["gqa4"]
PROMPT = mixed_prompt(HP, 30, np.random.default_rng(11))
K = 18


def _available(name: str) -> bool:
    return any(r.name == name and r.available for r in s2core.list_backends())


def _prefix_and_reference(backend: str, weight_type: str = "f16", **options):
    m = s2core.load(kit_model("gqa4", weight_type), backend=backend, **options)
    m.init_kv_cache(40)
    m.prefill(PROMPT[:K])
    prefix = m.save_prefix()
    r = m.prefill_fast(PROMPT[K:])
    step = m.step(semantic_frame(HP, np.random.default_rng(1)))
    m.close()
    return prefix, (r.hidden, r.logits, step.logits)


@pytest.mark.parametrize("source,target,kv", [
    ("numpy", "torch", "f16"), ("torch", "numpy", "f16"), ("numpy", "mlx", "f16"),
    ("mlx", "torch", "f16"), ("numpy", "example", "f32"), ("torch", "mlx", "bf16"),
])
def test_prefix_saved_by_one_backend_restores_on_another(source, target, kv, tmp_path):
    for name in (source, target):
        if not _available(name):
            pytest.skip(f"backend {name} is not available here")
    options = {"kv_cache_dtype": kv} if kv != "f16" else {}
    # every backend offers "f32"; a prefix carries the numbers of the arithmetic it was made in
    options["arithmetic"] = "f32"
    prefix, _ = _prefix_and_reference(source, **options)
    path = prefix.save(tmp_path / "p.safetensors")
    _, expected = _prefix_and_reference(target, **options)  # the target's own numbers
    m = s2core.load(kit_model("gqa4", "f16"), backend=target, **options)
    m.init_kv_cache(40)
    assert m.restore_prefix(KVPrefix.load(path)) == "written"
    r = m.prefill_fast(PROMPT[K:])
    step = m.step(semantic_frame(HP, np.random.default_rng(1)))
    tol = output_tolerance(m.capabilities)
    for got, want, what in zip((r.hidden, r.logits, step.logits), expected,
                               ("hidden", "logits", "step logits")):
        assert_close(got, want, tol, f"{source} prefix on {target}: {what}")
    m.close()


class NoWriteBackend(NumpyBackend):
    """A backend as a third party might ship it: no write_kv_cache, and it says so."""

    name = "numpy-nowrite"
    write_kv_cache = Backend.write_kv_cache

    @property
    def capabilities(self):
        return dataclasses.replace(super().capabilities, writes_kv_cache=False)


def test_backend_without_write_recomputes_the_prefix():
    prefix, expected = _prefix_and_reference("numpy")
    mf = ModelFile(kit_model("gqa4", "f16"))
    m = SlowARModel(mf, NoWriteBackend(mf))
    m.init_kv_cache(40)
    assert m.restore_prefix(prefix) == "recomputed" and m.n_past == K
    r = m.prefill_fast(PROMPT[K:])
    step = m.step(semantic_frame(HP, np.random.default_rng(1)))
    for got, want in zip((r.hidden, r.logits, step.logits), expected):
        np.testing.assert_array_equal(got, want)  # same code path as the numpy backend's
    m.close()


# ---------------------------------------------------------------------- file format
@pytest.mark.parametrize("kv", ["f16", "f32", "bf16"])
def test_file_round_trip_is_exact_and_memory_mapped(kv, tmp_path):
    backend = "torch" if kv == "bf16" else "numpy"
    if not _available(backend):
        pytest.skip(f"{backend} not available")
    prefix, _ = _prefix_and_reference(backend, kv_cache_dtype=kv)
    path = prefix.save(tmp_path / "p.safetensors")
    loaded = KVPrefix.load(path)
    assert isinstance(loaded._k, np.memmap)  # noqa: SLF001 - the point of the format
    np.testing.assert_array_equal(loaded.k, prefix.k)
    np.testing.assert_array_equal(loaded.v, prefix.v)
    np.testing.assert_array_equal(loaded.tokens, prefix.tokens)
    assert loaded.model == prefix.model and loaded.kv_cache_dtype == kv
    assert loaded.backend == backend
    width = {"f16": 2, "bf16": 2, "f32": 4}[kv]
    assert path.stat().st_size < 2 * prefix.k.size * width + 4096 + prefix.tokens.nbytes
    # safetensors itself reads it (the format is the ecosystem's)
    from safetensors.numpy import load_file
    assert set(load_file(path)) == {"k", "v", "tokens"}


def test_prefix_refuses_values_its_cache_type_cannot_hold():
    prefix, _ = _prefix_and_reference("numpy")
    k = prefix.k.copy()
    k[0, 0, 0, 0] += 1e-4  # not an f16 number any more
    with pytest.raises(PrefixFileError, match="not f16 numbers"):
        KVPrefix(k, prefix.v, prefix.tokens, "f16", prefix.model)


def _corrupt(tmp_path, data: bytes):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    return path


def test_malformed_files_are_refused(tmp_path):
    prefix, _ = _prefix_and_reference("numpy")
    good = prefix.save(tmp_path / "good.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", good[:8])
    header = json.loads(good[8:8 + n])

    def with_header(h):
        raw = json.dumps(h).encode()
        return struct.pack("<Q", len(raw)) + raw + good[8 + n:]

    cases = {
        "empty": b"",
        "short": good[:5],
        "truncated": good[:-100],
        "huge header length": struct.pack("<Q", 10**12) + good[8:],
        "not json": struct.pack("<Q", 4) + b"\xff\xfe{{" + good[8:],
        "other format": with_header({**header, "__metadata__": {**header["__metadata__"],
                                                                "format": "something/1"}}),
        "no v": with_header({k: v for k, v in header.items() if k != "v"}),
        "k as f32": with_header({**header, "k": {**header["k"], "dtype": "F32"}}),
        "bad identity": with_header({**header, "__metadata__": {**header["__metadata__"],
                                                                "model": "{"}}),
        "bad dtype name": with_header({**header, "__metadata__": {**header["__metadata__"],
                                                                  "kv_cache_dtype": "q8"}}),
        "bad offsets": with_header({**header, "tokens": {**header["tokens"],
                                                         "data_offsets": [0, 3]}}),
    }
    for what, data in cases.items():
        with pytest.raises(PrefixFileError):
            KVPrefix.load(_corrupt(tmp_path, data))
    with pytest.raises(PrefixFileError, match="not found"):
        KVPrefix.load(tmp_path / "missing.safetensors")


# ---------------------------------------------------------------------- identity
def test_identity_tells_files_apart_and_is_stable(tmp_path):
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    write_model(a, tiny_hparams(), "f32", seed=1)
    write_model(b, tiny_hparams(), "f32", seed=2)          # same shapes, other weights
    write_model(c, tiny_hparams(), "f16", seed=1)          # same weights, other types
    ia, ib, ic = (ModelIdentity.of(ModelFile(p)) for p in (a, b, c))
    assert ia == ModelIdentity.of(ModelFile(a))
    assert ia != ib and ia.tensors_sha256 == ib.tensors_sha256
    assert ib.differences(ia) == ["tensor contents differ"]
    assert ia != ic and "tensor table (names, types or shapes) differs" in ia.differences(ic)
    assert ModelIdentity.from_json(ia.to_json()) == ia and len(ia.digest) == 64
    d = tmp_path / "d.gguf"
    write_model(d, tiny_hparams(rope_freq_base=5e5), "f32", seed=1)
    assert any("rope_freq_base" in x for x in ModelIdentity.of(ModelFile(d)).differences(ia))


def test_a_prefix_with_out_of_range_token_rows_is_refused_before_anything_changes():
    from s2core.errors import InvalidTokensError
    prefix, _ = _prefix_and_reference("numpy")
    rows = prefix.tokens.copy()
    rows[2, 0] = HP.vocab_size + 3
    bad = KVPrefix(prefix.k, prefix.v, rows, prefix.kv_cache_dtype, prefix.model)
    for backend in (None, "nowrite"):
        mf = ModelFile(kit_model("gqa4", "f16"))
        m = SlowARModel(mf, NoWriteBackend(mf) if backend else NumpyBackend(mf))
        m.init_kv_cache(40)
        m.prefill(PROMPT[:5])
        with pytest.raises(InvalidTokensError) as info:
            m.restore_prefix(bad)
        assert info.value.check == "token_id_range" and m.n_past == 5
        assert m.token_rows()[:, 0].tolist() == PROMPT[:5, 0].tolist()
        m.close()
