"""s2core against s2.cpp's own outputs for an F16 and a Q8_0 file (tests/data/s2cpp_fidelity/).

The issue's targets with arithmetic="ggml": at most 1e-3 of the largest value on q8_0 files and
1e-4 on f16 files (max|out - ref| / max|ref| per output), and "ggml" closer to s2.cpp than "f32".
On F16 NumPy reproduces s2.cpp's AVX2 build bit for bit: every output equal
(backends/s2core_numpy/ggml_ops.py computes every float32 operation in that build's order).
That build is the one the shared goldens came from. s2.cpp's own AVX-512 and AVX512-FP16 builds
sum in other orders and differ from it, and from s2core, by 3e-4 to 1e-3. On Q8_0 "ggml"
reproduces s2.cpp's hidden states and logits to about 1e-7 (a V value flips, 1.2e-4): the
integer kernels add their blocks in another order. The folder's README gives the
measurements, and docs/arithmetic.md explains them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import s2core
from conftest import S2CPP_FIDELITY, S2CPP_VECTOR
from s2cpp_replay import CHUNK, calls, max_rel, replay, worst
from s2core import ModelFile
from s2core.embedded.writer import tiny_hparams, write_model
from s2core_numpy.plugin import numba_available

BOUND = {"q8_0": 1e-3, "f16": 1e-4}
SCENARIOS = ["s1_prefill_steps", "s5_fast_decode"]
PREFILLS = ["prefill_fast", "prefill_chunked"]

#: s2.cpp's f16 outputs from three builds of ggml (README): AVX2 and AVX-512 sum F16
#: products in float32; -march=native on this AVX512-FP16 CPU sums them in half precision
F16_BUILDS = ["f16-avx2", "f16-avx512", "f16-avx512fp16"]
F32_SUMS = ["f16-avx2", "f16-avx512"]
#: the build NumPy's arithmetic="ggml" reproduces bit for bit (x86 with AVX2 and FMA)
REPRODUCED = "f16-avx2"
#: s2.cpp's q8_0 outputs, bit-identical from all three builds
Q8_0 = "q8_0"
#: AVX2 goldens on a model with S2 Pro's head_dim (128), two KV heads (a prefill's attention is
#: split by KV head where a one-head model's is not) and a 77-token prompt, written by
#: head128_hparams() at HEAD128_SEED (README: its SHA-256 is in the scenario)
HEAD128 = "s6_head128"
HEAD128_SEED = 3


def head128_hparams():
    hp = tiny_hparams(dim=256, ffn=512, n_head=4, n_head_kv=2, head_dim=128)
    return replace(hp, fast=replace(hp.fast, dim=256, ffn=512, n_head=4, n_head_kv=2,
                                    head_dim=128))


@pytest.fixture(scope="module")
def head128_model(tmp_path_factory) -> Path:
    """The head_dim-128 F16 model s2.cpp ran, written again here and checked byte for byte."""
    path = tmp_path_factory.mktemp("head128") / "head128_f16.gguf"
    write_model(path, head128_hparams(), "f16", seed=HEAD128_SEED)
    want = json.loads((S2CPP_FIDELITY / REPRODUCED / HEAD128 / "scenario.json").read_text())
    assert hashlib.sha256(path.read_bytes()).hexdigest() == want["model_sha256"], (
        "write_model no longer writes the model s2.cpp's goldens were computed on")
    return path


def model_of(outputs: str) -> Path:
    return S2CPP_FIDELITY / f"tiny_{outputs.split('-')[0]}.gguf"


def folder(outputs: str, name: str, prefill: str) -> Path:
    """The goldens of one prefill: the chunked prefill has its own, computed by s2.cpp as
    successive calls of CHUNK tokens."""
    chunked = prefill == "prefill_chunked"
    path = S2CPP_FIDELITY / outputs / (f"{name}_chunked{CHUNK}" if chunked else name)
    chunk = json.loads((path / "scenario.json").read_text()).get("prefill_chunk")
    assert chunk == (CHUNK if chunked else None), path
    return path


def needs_ggml(backend: str) -> None:
    declared = s2core.get_registry().info(backend).capabilities.arithmetics
    if "ggml" not in declared:
        pytest.skip(f"{backend} declares arithmetics {declared}, not 'ggml'")


def errors_of(backend: str, outputs: str, name: str, prefill: str,
              arithmetic: str, model: Path | None = None) -> dict[str, float]:
    m = s2core.load(model or model_of(outputs), backend=backend, arithmetic=arithmetic)
    try:
        assert m.capabilities.arithmetic == arithmetic
        errors = replay(m, folder(outputs, name, prefill), prefill)
    finally:
        m.close()
    assert len(errors) >= 18
    return errors


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("prefill", PREFILLS)
def test_q8_0_within_the_issue_bound(backend, name, prefill):
    needs_ggml(backend)
    which, error = worst(errors_of(backend, Q8_0, name, prefill, "ggml"))
    assert error <= BOUND["q8_0"], f"worst: {which} = {error:.2e}"


@pytest.mark.parametrize("outputs", [Q8_0] + F32_SUMS)
@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("prefill", PREFILLS)
def test_ggml_is_closer_to_s2cpp_than_f32(backend, outputs, name, prefill):
    """Worst and median output. Not against the AVX512-FP16 build: its half-precision sums
    are an arithmetic s2core does not implement, and neither arithmetic is closer there."""
    needs_ggml(backend)
    ggml = errors_of(backend, outputs, name, prefill, "ggml")
    f32 = errors_of(backend, outputs, name, prefill, "f32")
    assert worst(ggml)[1] < worst(f32)[1], f"ggml {worst(ggml)}, f32 {worst(f32)}"
    assert np.median(list(ggml.values())) < np.median(list(f32.values()))


def needs_numba() -> None:
    if not numba_available():
        pytest.skip("NumPy computes s2.cpp's float32 order with numba's kernels (ggml_ops.py); "
                    "numba is not installed")


@pytest.mark.parametrize("name", SCENARIOS + [HEAD128])
@pytest.mark.parametrize("prefill", PREFILLS)
def test_numpy_f16_equals_the_avx2_build_bit_for_bit(name, prefill, head128_model):
    """Every hidden state, logit, K/V value and Fast-AR logit of every call equal to s2.cpp's
    (the issue asks 1e-4): prefills in one call and in chunks, steps, Fast-AR calls; head_dim
    32 and S2 Pro's 128, one and two KV heads, prompts of 40 and 77 positions."""
    needs_numba()
    errors = errors_of("numpy", REPRODUCED, name, prefill, "ggml",
                       head128_model if name == HEAD128 else None)
    which, error = worst(errors)
    assert error == 0.0, f"{which} differs by {error:.2e} of its largest value"


def test_numpy_f16_within_the_issue_bound():
    """The issue's bound over every scenario and prefill of the build the shared goldens came
    from."""
    needs_numba()
    errors = {f"{name} {prefill} {k}": v for name in SCENARIOS for prefill in PREFILLS
              for k, v in errors_of("numpy", REPRODUCED, name, prefill, "ggml").items()}
    which, error = worst(errors)
    assert error <= BOUND["f16"], f"worst: {which} = {error:.2e}"


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "other builds, other arithmetic: AVX-512 sums float32 in 16 lanes, AVX512-FP16 sums F16 "
    "products in half precision; s2core reproduces the AVX2 build, and is 3.1e-4 to 3.5e-4 "
    "from AVX-512 and 5.8e-4 to 1.0e-3 from AVX512-FP16, as those builds are from AVX2"))
@pytest.mark.parametrize("outputs", [b for b in F16_BUILDS if b != REPRODUCED])
def test_f16_other_builds_within_the_issue_bound(backend, outputs):
    """Every scenario and prefill of one build's goldens together."""
    needs_ggml(backend)
    errors = {f"{name} {prefill} {k}": v for name in SCENARIOS for prefill in PREFILLS
              for k, v in errors_of(backend, outputs, name, prefill, "ggml").items()}
    which, error = worst(errors)
    assert error <= BOUND["f16"], f"worst: {which} = {error:.2e}"


def output_files(outputs: str, name: str) -> list[str]:
    keys = ("hidden", "logits", "fast_logits")
    return [c[k] for c in calls(S2CPP_FIDELITY / outputs / name) for k in keys if k in c]


@pytest.mark.parametrize("name", SCENARIOS)
def test_s2cpp_builds_differ_by_more_than_the_f16_bound(name):
    """Why one build is reproduced and not all, held to the data: s2.cpp's AVX2 and AVX-512
    builds, which compute the same rule and only sum float32 lanes in another order, differ
    by more than 1e-4 on the f16 file."""
    a, b = (S2CPP_FIDELITY / outputs / name for outputs in F32_SUMS)
    spread = max(max_rel(np.load(a / f), np.load(b / f)) for f in output_files(F32_SUMS[0], name))
    assert spread > BOUND["f16"]


# ---------------------------------------------------------------------- the files themselves
def test_files_hold_the_shared_f32_weights_as_s2cpps_tools_would_store_them():
    """README: every tensor of tiny_f16 is tiny_f32's rounded to f16 (s2.cpp's exporter
    writes every floating tensor in its out-dtype); tiny_q8_0 quantizes those f16 values to
    Q8_0 for the 2-D tensors and keeps the 1-D norms F16 (llama.cpp's quantizer's rule)."""
    f32 = ModelFile(S2CPP_VECTOR / "tiny_f32.gguf")
    f16 = ModelFile(S2CPP_FIDELITY / "tiny_f16.gguf")
    q8 = ModelFile(S2CPP_FIDELITY / "tiny_q8_0.gguf")
    names = [t.name for t in f32.model_tensors()]
    assert [t.name for t in f16.model_tensors()] == [t.name for t in q8.model_tensors()] == names
    assert f16.hparams == q8.hparams == f32.hparams
    for name in names:
        rounded = f32.dequantize(name).astype(np.float16)
        assert f16.info(name).type == QT.F16
        assert np.array_equal(f16.raw(name), rounded), name
        if rounded.ndim == 1:
            assert q8.info(name).type == QT.F16 and np.array_equal(q8.raw(name), rounded), name
        else:
            assert q8.info(name).type == QT.Q8_0, name
            blocks = gguf.quants.quantize(rounded.astype(np.float32), QT.Q8_0)
            assert np.array_equal(q8.raw(name), blocks), name
