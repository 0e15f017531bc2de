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
from s2core.runtime.chunking import CHUNK_BUDGET, CHUNK_MAX, CHUNK_MIN, prefill_chunk_size  # noqa: E402
from s2core.errors import BackendUnavailableError, InvalidInputError  # noqa: E402
from s2core.modelfile.file import ModelFile  # noqa: E402
from s2core.kit.batching_rules import voice_prefix  # noqa: E402
from s2core.kit.conformance import prompt_and_frames, rel_err  # noqa: E402
from s2core.kit.models import kit_model, kit_reference  # noqa: E402
from s2core.kit.tolerances import fast_tolerance, kv_tolerance, output_tolerance  # noqa: E402
from s2core.kit.prompts import semantic_frame  # noqa: E402
from s2core.embedded.writer import tiny_hparams, write_model  # noqa: E402
from s2core_torch import ops, plugin, weights  # noqa: E402

CPU = {"device": "cpu"}


def load(config: str = "gqa4", weight_type: str = "f32", **options):
    return load_path(kit_model(config, weight_type), **options)


def load_path(path, **options):
    return s2core.load(path, backend="torch", **{**CPU, **options})


def semantic_prompt(hp, n: int) -> np.ndarray:
    """A prompt of n semantic positions (generation frames) for a model of hparams hp."""
    rng = np.random.default_rng(0)
    return np.stack([semantic_frame(hp, rng) for _ in range(n)])


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
    # An f16 cache is held as is on CUDA, in float32 (f16-rounded values) on the CPU.
    assert caps.kv_cache_dtype == "f16"
    assert caps.kv_cache_held_dtype == ("f16" if torch.cuda.is_available() else "f32")
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


# ------------------------------------------------------------------ the incremental Fast-AR
def test_fast_ar_frame_computes_each_position_once(model_f16):
    """The calls of one frame (prefixes growing by one code) reuse one state: each computes
    only its new position, and the logits are fast_decode's from scratch."""
    m = model_f16
    hp = m.hparams
    rng = np.random.default_rng(5)
    hidden = rng.standard_normal(hp.dim).astype(np.float32)
    codes = rng.integers(0, hp.codebook_size, hp.num_codebooks - 1)
    tol = fast_tolerance(m.capabilities)
    state = None
    for n in range(hp.num_codebooks):  # prefixes 0 .. num_codebooks - 1
        out = m.fast_decode(hidden, codes[:n])
        session = m._fast
        if state is None:
            state = session.state
            # one sequence: B = 1 of fast_ar.FastState's (B, n_layer, n_head_kv, ctx, d)
            assert state.k.shape == (1, hp.fast.n_layer, hp.fast.n_head_kv,
                                     hp.fast.context_length, hp.fast.head_dim)
            assert state.k.dtype == torch.float32 and state.k.device.type == "cpu"
        assert session.state is state  # the same state, extended in place
        assert state.length == n + 1
        assert state.positions_computed == n + 1  # not 1 + 2 + ... + (n + 1)
        scratch = m.backend.to_numpy(m.backend.fast_decode(hidden, codes[:n]))
        assert rel_err(out, scratch) < tol
    # A new frame (another hidden) starts a new state at position 0.
    m.fast_decode(hidden + 1.0, codes[:1])
    assert m._fast.state is not state and m._fast.state.positions_computed == 2


def test_fast_extend_appends_several_codes_at_once():
    with load("gqa2-noqk", "f32") as m:
        b, hp = m.backend, m.hparams
        ref = kit_reference("gqa2-noqk", "f32")
        rng = np.random.default_rng(6)
        hidden = rng.standard_normal(hp.dim).astype(np.float32)
        codes = rng.integers(0, hp.codebook_size, hp.fast.context_length - 1)  # the most
        tol = fast_tolerance(m.capabilities)
        state, logits = b.fast_begin(hidden)
        assert rel_err(b.to_numpy(logits), ref.fast_decode(hidden, codes[:0])) < tol
        state, logits = b.fast_extend(state, codes[:4])  # four positions in one pass
        assert (state.length, state.positions_computed) == (5, 5)
        assert rel_err(b.to_numpy(logits), ref.fast_decode(hidden, codes[:4])) < tol
        for n in range(5, len(codes) + 1):
            state, logits = b.fast_extend(state, codes[n - 1:n])
            assert rel_err(b.to_numpy(logits), ref.fast_decode(hidden, codes[:n])) < tol
        assert state.length == state.capacity == hp.fast.context_length
        with pytest.raises(ValueError, match="context"):
            b.fast_extend(state, codes[:1])  # past the Fast-AR's context


# ------------------------------------------------------------------ the KV cache
@pytest.mark.parametrize("cache_dtype", ["f16", "bf16"])
def test_narrow_cache_holds_rounded_values_in_float32_on_cpu(cache_dtype):
    """On the CPU an f16/bf16 cache is held in float32 (attention reads it in place, no
    per-step conversion of the history), and every value in it is rounded to its type."""
    narrow = {"f16": torch.float16, "bf16": torch.bfloat16}[cache_dtype]
    prompt, frames = prompt_and_frames("gqa4")
    with load("gqa4", "f32", kv_cache_dtype=cache_dtype) as m:
        caps = m.capabilities
        assert (caps.kv_cache_dtype, caps.kv_cache_held_dtype) == (cache_dtype, "f32")
        m.init_kv_cache(64)
        m.prefill(prompt)
        m.step(frames[0])
        cache = m.backend._cache
        assert cache.k.dtype == cache.v.dtype == torch.float32
        stored = [cache.k[:, :, :m.n_past], cache.v[:, :, :m.n_past]]
        for t in stored:  # the rows of the prefill and of the step were both rounded
            assert torch.equal(t.to(narrow).float(), t)
        k, v = m.kv_cache_snapshot()
        assert k.dtype == np.float32
        for x in (k, v):  # every value survives a round trip: it holds a narrow value
            t = torch.from_numpy(x)
            assert torch.equal(t.to(narrow).float(), t)
        ref = kit_reference("gqa4", "f32").forward(np.vstack([prompt, frames[0]]))
        err = rel_err(k, ref.k)
        assert 1e-5 < err < kv_tolerance(m.capabilities)  # one rounding, no worse
    with load("gqa4", "f32", kv_cache_dtype="f32") as m:
        assert m.capabilities.kv_cache_held_dtype == "f32"
        assert m.capabilities.kv_cache_storage_dtype is None


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


@pytest.fixture(scope="module")
def big_table_models(tmp_path_factory):
    """Models whose 200000 x 64 embedding table dominates: 13.6 MB in q8_0, 25.6 MB in f16."""
    d = tmp_path_factory.mktemp("release")
    hp = tiny_hparams(vocab_size=200_000)
    return {t: write_model(d / f"{t}.gguf", hp, t).path for t in ("q8_0", "f16")}


@pytest.fixture
def released(monkeypatch):
    """Names passed to ModelFile.release (which still runs)."""
    names = []
    real = ModelFile.release

    def spy(self, name):
        names.append(name)
        real(self, name)
    monkeypatch.setattr(ModelFile, "release", spy)
    return names


def test_widened_tensors_release_their_pages_and_mapped_ones_do_not(big_table_models, released):
    with load_path(big_table_models["q8_0"]) as q:
        widened = {t.name for t in q.model_file.model_tensors() if t.type_name == "q8_0"}
        assert widened and set(released) == widened  # every copy, nothing else (f32 norms)
    released.clear()
    with load_path(big_table_models["f16"]) as m:
        m.init_kv_cache(8)
        m.prefill(semantic_prompt(m.hparams, 4))
        assert released == []  # used in place from the map: never released


_RSS_AFTER_LOAD = """
import sys, psutil, s2core
from s2core.modelfile.file import ModelFile
from s2core.kit.models import kit_model
from s2core.runtime.memory import resident_weight_bytes
from s2core_torch import weights
path, release = sys.argv[1], sys.argv[2] == "1"
weights._SLAB_ELEMENTS = 1 << 16  # small slabs: the allocator keeps no big temporaries
if not release:
    ModelFile.release = lambda self, name: None
with s2core.load(kit_model("gqa4", "q8_0"), backend="torch", device="cpu"):
    pass  # torch's lazy initialization, outside the measurement
proc = psutil.Process()
before = proc.memory_info().rss
m = s2core.load(path, backend="torch", device="cpu")
grown = proc.memory_info().rss - before
mapped = sum(r.rss for r in proc.memory_maps(grouped=True) if r.path == str(path))
file_bytes = sum(t.n_bytes for t in m.model_file.model_tensors() if t.type_name != "f32")
print(grown, mapped, resident_weight_bytes(m.model_file, m.capabilities), file_bytes)
"""


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("release", [True, False])
def test_resident_memory_after_widening_is_the_copies(big_table_models, release):
    pytest.importorskip("psutil")
    """After loading a q8_0 file a fresh process holds the f16 copies, not also the file pages
    that dequantizing read (release=False: what the bounds catch). Loose bounds on RSS."""
    path = os.path.realpath(big_table_models["q8_0"])
    out = subprocess.run([sys.executable, "-c", _RSS_AFTER_LOAD, path, str(int(release))],
                         capture_output=True, text=True, check=True)
    grown, mapped, copies, file_bytes = (int(x) for x in out.stdout.split())
    assert copies > 1.8 * file_bytes  # f16 copies of q8_0 (8.5 bits a weight)
    if release:
        assert mapped < 0.1 * file_bytes, (mapped, file_bytes)
        assert grown < copies + 0.5 * file_bytes, (grown, copies, file_bytes)
    else:
        assert mapped > 0.8 * file_bytes, (mapped, file_bytes)
        assert grown > copies + 0.8 * file_bytes, (grown, copies, file_bytes)


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


def test_one_query_attention_matches_sdpa_on_strided_history():
    """A decode step's attention (one query, no mask, keys a strided view of the cache) takes
    the two-product path on the CPU; it gives SDPA's and the float64 result."""
    torch.manual_seed(2)
    n_head, n_kv, d, t = 8, 2, 16, 37
    q = torch.randn(1, n_head, d)
    cache_k, cache_v = torch.randn(n_kv, 64, d), torch.randn(n_kv, 64, d)
    keys, values = cache_k[:, :t], cache_v[:, :t]  # rows of a longer cache, as KVCache gives
    out = ops.attention(q, keys, values, None, d ** -0.5)
    sdpa = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys[None], values[None],
                                          scale=d ** -0.5, enable_gqa=True)[0].transpose(0, 1)
    group = n_head // n_kv
    ref = torch.stack([(q[0, h].double() @ keys[h // group].double().T * d ** -0.5).softmax(-1)
                       @ values[h // group].double() for h in range(n_head)])
    assert out.shape == (1, n_head * d) and out.dtype == torch.float32
    torch.testing.assert_close(out, sdpa.reshape(1, -1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.double(), ref.reshape(1, -1), rtol=1e-5, atol=1e-6)


def test_rms_norm_is_float32_for_half_input():
    x = torch.randn(4, 64).half()
    w = torch.rand(64)
    out = ops.rms_norm(x, w, 1e-6)
    assert out.dtype == torch.float32
    ref = x.double() / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, F.rms_norm(x.float(), (64,), w, 1e-6))


# ------------------------------------------------------------------ shared voice prefixes
def test_slots_in_one_voice_hold_its_prefix_once():
    """Four slots that start with one voice reference one copy of its K/V (the same device
    storage, in the held cache type), each slot's cache holds only its own positions, so a
    slot reaches the voice's length + its capacity; a released voice's tensors are dropped."""
    from s2core.serving.batching import BatchedModel
    from s2core.runtime.memory import backend_kv_cache_bytes
    from s2core.kit.prompts import mixed_prompt

    m = load("gqa4", "f16")
    hp, caps, be = m.hparams, m.capabilities, m.backend
    assert caps.shares_kv_prefix
    rng = np.random.default_rng(3)
    voice = mixed_prompt(hp, 40, rng)
    prefix = voice_prefix(m, voice)
    own = 10
    b = BatchedModel(m, idle_voices=0)
    b.init_slots(4, own)
    assert [b.restore_prefix(s, prefix) for s in range(4)] == ["shared"] * 4

    def held_storages() -> dict[int, int]:
        tensors = [t for c in be._slots for t in (c.k, c.v)]
        tensors += [t for p in be._prefixes.held.values() for t in (p.k, p.v)]
        return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}

    one_voice = backend_kv_cache_bytes(hp, len(voice), caps)
    slots = 4 * backend_kv_cache_bytes(hp, own, caps)
    # copied into each slot, the voice would be four times in the slots' storages
    assert sum(held_storages().values()) == slots + one_voice, (held_storages(), slots, one_voice)
    assert len({id(c.prefix) for c in be._slots}) == 1 and b.held_voice_bytes == one_voice
    b.eval([(s, mixed_prompt(hp, own, rng)) for s in range(4)])  # every own position used
    assert [b.n_past(s) for s in range(4)] == [len(voice) + own] * 4
    k, v = b.kv_slot_snapshot(2)  # the voice's rows, then the slot's own
    assert k.shape[1] == len(voice) + own
    np.testing.assert_array_equal(k[:, :len(voice)], prefix.k)
    np.testing.assert_array_equal(v[:, :len(voice)], prefix.v)
    for s in range(4):
        b.reset_slot(s)  # idle_voices=0: the voice is released with its last slot
    assert not be._prefixes.held and all(c.prefix is None for c in be._slots)
    assert sum(held_storages().values()) == slots
    b.close()
    m.close()
