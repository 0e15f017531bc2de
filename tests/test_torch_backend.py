"""The PyTorch backend's own tests (the conformance matrix runs it through tests/test_conformance.py).

These run on the CPU everywhere; nothing here pretends to be a GPU.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import s2core  # noqa: E402
from s2core.chunking import CHUNK_BUDGET, CHUNK_MAX, CHUNK_MIN, prefill_chunk_size  # noqa: E402
from s2core.errors import BackendUnavailableError, InvalidInputError  # noqa: E402
from s2core.gguf_file import ModelFile  # noqa: E402
from s2core.kit.conformance import prompt_and_frames, rel_err  # noqa: E402
from s2core.kit.models import kit_model, kit_reference  # noqa: E402
from s2core.kit.tolerances import kv_tolerance, output_tolerance  # noqa: E402
from s2core_torch import ops, plugin, weights  # noqa: E402

CPU = {"device": "cpu"}


def load(config: str = "gqa4", weight_type: str = "f32", **options):
    return s2core.load(kit_model(config, weight_type), backend="torch", **{**CPU, **options})


@pytest.fixture
def model_f16():
    m = load("gqa4", "f16")
    yield m
    m.close()


# ------------------------------------------------------------------ plugin and probe
def test_plugin_and_probe_do_not_import_torch():
    code = ("import sys, s2core_torch.plugin as p; r = p.probe(); "
            "print(r.available, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr


def test_probe_matches_what_torch_sees(monkeypatch):
    monkeypatch.delenv(plugin.ENV_DEVICE, raising=False)
    monkeypatch.delenv(plugin.ENV_DTYPE, raising=False)
    p = plugin.probe()
    assert p.available
    caps = p.capabilities
    if torch.cuda.is_available():
        assert (p.priority, caps.device, caps.accelerator) == (plugin.CUDA_PRIORITY, "cuda", True)
        assert caps.n_accelerated_layers is None  # "all layers" until a model is loaded
    else:
        assert (p.priority, caps.device, caps.accelerator) == (plugin.CPU_PRIORITY, "cpu", False)
    assert caps.supported_kv_cache_dtypes == ("f16", "bf16", "f32")
    assert caps.native_weight_types == {"f32", "f16", "bf16"}
    assert caps.requires_single_token_semantic_prefill is False


def test_probe_reports_bad_environment(monkeypatch):
    monkeypatch.setenv(plugin.ENV_DEVICE, "tpu")
    assert not plugin.probe().available and "tpu" in plugin.probe().reason
    monkeypatch.setenv(plugin.ENV_DEVICE, "cpu")
    monkeypatch.setenv(plugin.ENV_DTYPE, "f16")
    p = plugin.probe()
    assert not p.available and "f16" in p.reason
    monkeypatch.setenv(plugin.ENV_DTYPE, "f32")
    p = plugin.probe()
    assert p.available and p.priority == plugin.CPU_PRIORITY and p.capabilities.device == "cpu"


# ------------------------------------------------------------------ options
def test_unavailable_cuda_device_is_a_clear_error():
    index = 7 if not torch.cuda.is_available() else torch.cuda.device_count() + 7
    with pytest.raises(BackendUnavailableError, match=rf"cuda:{index}.*(CUDA|device)"):
        load(device=f"cuda:{index}")


@pytest.mark.parametrize("options,check", [
    ({"dtype": "f64"}, "dtype"),
    ({"dtype": "f16"}, "dtype"),            # half compute is a CUDA option; CPU is f32
    ({"kv_cache_dtype": "f8"}, "kv_cache_dtype"),
    ({"device": "gpu"}, "device"),
    ({"device": "cuda:x"}, "device"),
    ({"single_token_semantic_prefill": "yes"}, "single_token_semantic_prefill"),
    ({"single_token_semantic_prefill": 1}, "single_token_semantic_prefill"),
])
def test_bad_options_are_rejected(options, check):
    with pytest.raises(InvalidInputError) as info:
        load(**options)
    assert info.value.check == check
    assert str(next(iter(options.values()))) in str(info.value)


def test_environment_chooses_device_and_dtype(monkeypatch):
    monkeypatch.setenv(plugin.ENV_DEVICE, "cpu")
    monkeypatch.setenv(plugin.ENV_DTYPE, "bf16")  # not offered on the CPU
    path = kit_model("gqa4", "f32")
    with pytest.raises(InvalidInputError, match="dtype='bf16'"):
        s2core.load(path, backend="torch")
    monkeypatch.setenv(plugin.ENV_DTYPE, "f32")
    with s2core.load(path, backend="torch") as m:
        assert m.capabilities.device == "cpu"


# ------------------------------------------------------------------ capabilities
@pytest.mark.parametrize("weight_type,compute", [
    ("f32", "f32"), ("f16", "f16"), ("bf16", "bf16"), ("q8_0", "f16"), ("q4_0", "f16")])
def test_cpu_capabilities_are_concrete(weight_type, compute):
    with load("gqa4", weight_type, kv_cache_dtype="bf16") as m:
        caps = m.capabilities
        assert caps.device == "cpu" and caps.accelerator is False
        assert caps.n_accelerated_layers == 0
        assert caps.compute_dtype == compute  # activations fed to the half GEMV
        assert caps.kv_cache_dtype == "bf16"
        assert caps.widened_weight_dtype == "f16"
        assert caps.requires_single_token_semantic_prefill is False  # auto: tables dequantized


def test_single_token_semantic_prefill_override_reaches_the_chunking_policy():
    prompt, _ = prompt_and_frames("gqa4", n_prompt=30)
    hp = s2core.ModelFile(kit_model("gqa4", "q8_0")).hparams
    n_sem = int(np.count_nonzero((prompt[:, 0] >= hp.semantic_begin_id)
                                 & (prompt[:, 0] <= hp.semantic_end_id)))
    assert n_sem > 1
    expected_clamp = min(max(CHUNK_BUDGET // hp.n_layer, CHUNK_MIN), CHUNK_MAX)

    with load("gqa4", "q8_0", single_token_semantic_prefill=True) as forced, \
            load("gqa4", "q8_0", single_token_semantic_prefill=False) as off, \
            load("gqa4", "q8_0") as auto:
        assert forced.capabilities.requires_single_token_semantic_prefill is True
        assert off.capabilities.requires_single_token_semantic_prefill is False
        assert auto.capabilities.requires_single_token_semantic_prefill is False
        # On the CPU the policy never chunks, whatever the flag says.
        assert prefill_chunk_size(len(prompt), n_sem, forced.capabilities) == len(prompt)
        # The same capabilities on an accelerator: the forced flag means one position per call.
        on_gpu = dataclasses.replace(forced.capabilities, accelerator=True,
                                     n_accelerated_layers=hp.n_layer)
        long = 4 * CHUNK_MAX  # long enough to be chunked on an accelerator
        assert prefill_chunk_size(long, n_sem, on_gpu) == 1
        assert prefill_chunk_size(long, 1, on_gpu) == expected_clamp  # one semantic: no need
        off_gpu = dataclasses.replace(off.capabilities, accelerator=True,
                                      n_accelerated_layers=hp.n_layer)
        assert prefill_chunk_size(long, n_sem, off_gpu) == expected_clamp
        # And a prefill in single-position calls gives the one-call result.
        forced.init_kv_cache(64)
        auto.init_kv_cache(64)
        one = auto.prefill(prompt)
        singles = forced.prefill(prompt, chunk_size=1)
        assert rel_err(singles.logits, one.logits) < output_tolerance(auto.capabilities)


# ------------------------------------------------------------------ the CPU f16 products
def test_half_gemv_keeps_f16_and_widens_for_many_rows():
    torch.manual_seed(0)
    w = (torch.randn(384, 256) / 16).half()
    exact_w = w.double()
    mm = ops.Matmul(torch.device("cpu"), torch.float32)
    for rows in (1, ops.CPU_HALF_MAX_ROWS):
        x = torch.randn(rows, 256)
        out = mm(x, w)
        assert out.dtype == torch.float16 and out.shape == (rows, 384)
        ref = x.half().double() @ exact_w.T  # f16 activations, exact accumulation
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-3  # only the output's f16 rounding (unit roundoff 4.9e-4)
    x = torch.randn(ops.CPU_HALF_MAX_ROWS + 1, 256)
    out = mm(x, w)
    assert out.dtype == torch.float32  # widened weight, float32 activations
    ref = x.double() @ exact_w.T
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-6
    buffer = mm.widen._buffer.data_ptr()
    mm(torch.randn(40, 256), w)
    assert mm.widen._buffer.data_ptr() == buffer  # reused, not reallocated per product


def test_f16_step_matches_reference(model_f16):
    """A decode step goes through the half GEMV path; its outputs stay within the f16 bound
    and are native float32 tensors."""
    prompt, frames = prompt_and_frames("gqa4")
    ref = kit_reference("gqa4", "f16")
    m = model_f16
    m.init_kv_cache(64)
    m.prefill(prompt)
    r = m.step(frames[0])
    expected = ref.forward(np.vstack([prompt, frames[0]]))
    assert isinstance(r.logits_native, torch.Tensor) and isinstance(r.hidden_native, torch.Tensor)
    assert r.hidden_native.dtype == r.logits_native.dtype == torch.float32
    assert r.hidden_native.shape == (m.hparams.dim,)
    assert r.logits_native.shape == (m.hparams.vocab_size,)
    tol = output_tolerance(m.capabilities)
    assert rel_err(r.hidden, expected.hidden) < tol
    assert rel_err(r.logits, expected.logits) < tol
    # Clearly worse than float32 compute, clearly better than the bound: the f16 path is used.
    assert rel_err(r.logits, expected.logits) > 1e-5


def test_results_are_fresh_tensors(model_f16):
    prompt, frames = prompt_and_frames("gqa4")
    m = model_f16
    m.init_kv_cache(64)
    first = m.prefill(prompt)
    kept = first.logits_native.clone()
    second = m.step(frames[0])
    assert second.logits_native.data_ptr() != first.logits_native.data_ptr()
    assert second.hidden_native.data_ptr() != first.hidden_native.data_ptr()
    assert torch.equal(first.logits_native, kept)  # a later call did not overwrite it
    assert first.logits.dtype == np.float32 and first.logits.shape == (m.hparams.vocab_size,)


def test_fast_decode_takes_native_hidden(model_f16):
    prompt, _ = prompt_and_frames("gqa4")
    m = model_f16
    m.init_kv_cache(64)
    r = m.prefill(prompt)
    codes = [3, 1, 4]
    native = m.fast_decode_native(r.hidden_native, codes)
    assert isinstance(native, torch.Tensor) and native.dtype == torch.float32
    assert native.shape == (m.hparams.codebook_size,)
    np.testing.assert_array_equal(m.backend.to_numpy(native), m.fast_decode(r.hidden, codes))


# ------------------------------------------------------------------ the KV cache
def test_bf16_cache_holds_bf16_values():
    prompt, _ = prompt_and_frames("gqa4")
    with load("gqa4", "f32", kv_cache_dtype="bf16") as m:
        m.init_kv_cache(64)
        m.prefill(prompt)
        assert m.backend._cache.k.dtype == torch.bfloat16
        k, v = m.kv_cache_snapshot()
        assert k.dtype == np.float32
        for x in (k, v):  # every value survives a round trip through bf16: it is stored as bf16
            t = torch.from_numpy(x)
            assert torch.equal(t.bfloat16().float(), t)
        ref = kit_reference("gqa4", "f32").forward(prompt)
        err = rel_err(k, ref.k)
        assert 1e-4 < err < kv_tolerance(m.capabilities)  # bf16 rounding, no worse


def test_cache_is_allocated_once_per_synthesis(model_f16):
    prompt, frames = prompt_and_frames("gqa4")
    m = model_f16
    m.init_kv_cache(64)
    cache = m.backend._cache
    pointers = (cache.k.data_ptr(), cache.v.data_ptr())
    m.prefill(prompt)
    for f in frames:
        m.step(f)
    m.reset()
    m.prefill(prompt[:5])
    assert m.backend._cache is cache
    assert (cache.k.data_ptr(), cache.v.data_ptr()) == pointers
    assert cache.k.shape == (m.hparams.n_layer, m.hparams.n_head_kv, 64, m.hparams.head_dim)
    m.clear_kv_cache()
    assert m.backend._cache is None


# ------------------------------------------------------------------ memory
def _file_mappings(path: Path) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of `path` (Linux /proc/self/maps)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and os.path.realpath(fields[5].strip()) == os.path.realpath(path):
                lo, hi = (int(a, 16) for a in fields[0].split("-"))
                ranges.append((lo, hi))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_cpu_f16_weights_are_the_memory_map_not_copies():
    with load("mha-k", "f16") as m, load("mha-k", "q4_k") as q:
        mapped = _file_mappings(kit_model("mha-k", "f16"))
        assert mapped

        def in_file(t: torch.Tensor) -> bool:
            start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
            return any(lo <= start and end <= hi for lo, hi in mapped)
        b = m.backend
        tensors = [b.embeddings, b.codebooks] + [w for blk in b.layers for w in blk.matrices()]
        assert all(t.dtype == torch.float16 for t in tensors)
        assert all(in_file(t) for t in tensors)
        # The check can fail: a quantized file's widened weights are copies.
        widened = q.backend.layers[0].w1
        assert widened.dtype == torch.float16 and not in_file(widened)


def test_quantized_weights_are_dequantized_slab_by_slab(monkeypatch):
    monkeypatch.setattr(weights, "_SLAB_ELEMENTS", 3 * 256)  # 3 rows of 256 per slab
    mf = ModelFile(kit_model("mha-k", "q4_k"))
    loader = weights.WeightLoader(mf, torch.device("cpu"), torch.float16)
    name = "layers.0.feed_forward.w1.weight"
    got = loader.matrix(name)
    expected = mf.dequantize(name).astype(np.float16)
    assert got.dtype == torch.float16 and got.shape == expected.shape
    np.testing.assert_array_equal(got.numpy(), expected)


# ------------------------------------------------------------------ ops
def test_rope_rotates_adjacent_pairs():
    head_dim, base, position = 8, 10000.0, 5
    x = torch.randn(1, 2, head_dim)
    table = ops.rope_table(position + 1, head_dim, base, torch.device("cpu"))
    out = ops.apply_rope(x, table[position:position + 1])
    expected = x.double().clone()
    for i in range(head_dim // 2):
        angle = position * base ** (-2.0 * i / head_dim)
        a, b = x[..., 2 * i].double(), x[..., 2 * i + 1].double()
        expected[..., 2 * i] = a * np.cos(angle) - b * np.sin(angle)
        expected[..., 2 * i + 1] = a * np.sin(angle) + b * np.cos(angle)
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)


def test_rope_angles_are_exact_at_long_positions():
    table = ops.rope_table(32768, 128, 1e6, torch.device("cpu"))
    angle = 32767 * 1.0  # i = 0: inv_freq 1
    assert abs(table[32767, 0].real.item() - np.cos(angle)) < 1e-7
    assert abs(table[32767, 0].imag.item() - np.sin(angle)) < 1e-7


def test_causal_mask_with_offset_and_gqa_attention():
    torch.manual_seed(1)
    n, n_past, n_head, n_kv, d = 3, 4, 8, 2, 16
    mask = ops.causal_mask(n, n_past, torch.device("cpu"))
    expected_mask = torch.tensor([[j <= n_past + i for j in range(n_past + n)] for i in range(n)])
    assert torch.equal(mask, expected_mask)
    assert ops.causal_mask(1, n_past, torch.device("cpu")) is None
    q = torch.randn(n, n_head, d)
    k = torch.randn(n_kv, n_past + n, d)
    v = torch.randn(n_kv, n_past + n, d)
    out = ops.attention(q, k, v, mask, d ** -0.5)
    group = n_head // n_kv
    ref = torch.empty(n, n_head, d, dtype=torch.float64)
    for h in range(n_head):
        scores = q[:, h].double() @ k[h // group].double().T * d ** -0.5
        scores = scores.masked_fill(~expected_mask, float("-inf"))
        ref[:, h] = scores.softmax(-1) @ v[h // group].double()
    torch.testing.assert_close(out.double(), ref.reshape(n, n_head * d), rtol=1e-5, atol=1e-5)


def test_rms_norm_is_float32_for_half_input():
    x = torch.randn(4, 64).half()
    w = torch.rand(64)
    out = ops.rms_norm(x, w, 1e-6)
    assert out.dtype == torch.float32
    ref = x.double() / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, F.rms_norm(x.float(), (64,), w, 1e-6))
