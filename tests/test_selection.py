"""load()'s choice of backend for a file, and the release of copied file pages."""

from __future__ import annotations

import numpy as np
import psutil
import pytest

import s2core
from s2core.contract.backend import Capabilities
from s2core.modelfile.file import ModelFile
from s2core.contract.registry import BackendInfo
from s2core.runtime.selection import choose_backend
from s2core.embedded.writer import tiny_hparams, write_model


def row(name, priority, native, widened="f32", available=True, accelerator=False):
    caps = Capabilities(accelerator=accelerator, native_weight_types=frozenset(native),
                        widened_weight_dtype=widened)
    return BackendInfo(name, priority, available, "", caps, "test")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("sel")
    return {t: ModelFile(write_model(d / f"{t}.gguf", tiny_hparams(), t).path)
            for t in ("f32", "f16", "q8_0", "q4_0")}


CPU_ROWS = [row("np", 100, {"f32", "q8_0"}), row("half", 90, {"f32", "f16"}, widened="f16"),
            row("slowcpu", 10, {"f32", "f16", "q8_0", "q4_0"}), row("ex", 0, {"f32"})]


@pytest.mark.parametrize("weight_type,expected", [
    ("f32", "np"),     # both keep f32: priority decides
    ("f16", "half"),   # kept as stored beats widened to f32
    ("q8_0", "np"),    # native q8_0 beats an f16 copy
    ("q4_0", "half"),  # nobody keeps it (within the band): the f16 copy is smaller
])
def test_peers_are_ranked_by_bytes_held(files, weight_type, expected):
    assert choose_backend(CPU_ROWS, files[weight_type]) == expected


def test_equal_holdings_go_by_priority_then_to_the_one_that_maps_the_file(files):
    """numpy-like (packs f16 into its own copy, priority 100) against torch-like (maps f16 in
    place, priority 90), the same bytes held: priority (the steady state) wins over fewer
    bytes copied (the load); between equal priorities the mapper wins."""
    def packer(priority=100):
        return BackendInfo("packer", priority, True, "", Capabilities(
            native_weight_types=frozenset({"f32", "f16"}),
            mapped_weight_types=frozenset({"f32"})), "test")
    mapper = BackendInfo("mapper", 90, True, "", Capabilities(
        native_weight_types=frozenset({"f32", "f16"}),
        mapped_weight_types=frozenset({"f32", "f16"})), "test")
    assert choose_backend([packer(), mapper], files["f16"]) == "packer"
    assert choose_backend([packer(), mapper], files["f32"]) == "packer"
    assert choose_backend([packer(90), mapper], files["f16"]) == "mapper"
    assert choose_backend([packer(90), mapper], files["f32"]) == "mapper"  # then by name
    from s2core.runtime.memory import copied_weight_bytes
    assert copied_weight_bytes(files["f16"], mapper.capabilities) == 0
    assert copied_weight_bytes(files["f16"], packer().capabilities) == sum(
        t.n_bytes for t in files["f16"].model_tensors() if t.type_name == "f16")


@pytest.fixture(scope="module")
def s2pro_typed_files(tmp_path_factory):
    """One-layer demo-shaped files (rows of whole K-quant blocks) of the four benchmarked
    types."""
    import dataclasses
    from s2core.embedded.writer import demo_hparams
    d = tmp_path_factory.mktemp("sel-types")
    hp = dataclasses.replace(demo_hparams(), n_layer=1)
    return {t: ModelFile(write_model(d / f"{t}.gguf", hp, t, random_blocks=t == "q4_k_m").path)
            for t in ("f32", "f16", "q8_0", "q4_k_m")}


# What the batch case measured on this project's machines with little else running
# (docs/backend-choice.md), as the declared capabilities must reproduce it: with numba NumPy
# is the faster on f16 (its default arithmetic for f16 files, "f32", copies them into its
# tiled layout; "ggml" multiplies the rows in place: either way the pick), q8_0 and q4_k_m,
# and on f32 at 4 sequences (even with torch at one); without numba NumPy computes from
# float32 copies, and torch's f16 (half the bytes) is the faster except on f32 files, which
# both map.
@pytest.mark.parametrize("numba_kernels,arithmetic,expected", [
    (True, None, {"f32": "numpy", "f16": "numpy", "q8_0": "numpy", "q4_k_m": "numpy"}),
    (True, "f32", {"f32": "numpy", "f16": "numpy", "q8_0": "numpy", "q4_k_m": "numpy"}),
    (False, None, {"f32": "numpy", "f16": "torch", "q8_0": "torch", "q4_k_m": "torch"}),
])
def test_the_registered_cpu_backends_declare_the_measured_pick(s2pro_typed_files, numba_kernels,
                                                               arithmetic, expected):
    from s2core_numpy import plugin as numpy_plugin
    from s2core_torch import plugin as torch_plugin
    rows = [BackendInfo("numpy", numpy_plugin.PRIORITY, True, "",
                        numpy_plugin.numpy_capabilities(numba_kernels=numba_kernels,
                                                        arithmetic=arithmetic), "test"),
            BackendInfo("torch", torch_plugin.CPU_PRIORITY, True, "",
                        torch_plugin.torch_capabilities("cpu", "f16", n_accelerated_layers=0),
                        "test")]
    picks = {t: choose_backend(rows, mf) for t, mf in s2pro_typed_files.items()}
    assert picks == expected


def test_accelerator_far_above_wins_regardless_of_bytes(files):
    rows = CPU_ROWS + [row("gpu", 300, {"f32"}, widened="f32", accelerator=True)]
    assert choose_backend(rows, files["q4_0"]) == "gpu"
    rows = CPU_ROWS + [row("gpu", 300, {"f32"}, available=False)]
    assert choose_backend(rows, files["q4_0"]) == "half"


def test_nothing_available_names_the_reasons(files):
    with pytest.raises(s2core.BackendUnavailableError, match="no backend is available"):
        choose_backend([row("np", 100, {"f32"}, available=False)], files["f32"])


def test_load_uses_the_choice_unless_env_names_one(files, monkeypatch):
    monkeypatch.delenv("S2CORE_BACKEND", raising=False)
    rows = s2core.list_backends()
    expected = choose_backend(rows, files["f16"])
    assert s2core.load(files["f16"].path).backend.name == expected
    monkeypatch.setenv("S2CORE_BACKEND", "numpy")
    assert s2core.load(files["f16"].path).backend.name == "numpy"


def test_release_drops_copied_pages_but_keeps_the_data(tmp_path):
    hp = tiny_hparams(vocab_size=40000)  # a 5 MB f16 table, many pages
    mf = ModelFile(write_model(tmp_path / "big.gguf", hp, "f16").path)
    proc = psutil.Process()
    before = proc.memory_info().rss
    first = mf.dequantize("embeddings.weight")
    mapped = proc.memory_info().rss
    mf.release("embeddings.weight")
    after = proc.memory_info().rss
    assert mapped - after > 0.8 * mf.info("embeddings.weight").n_bytes, (before, mapped, after)
    np.testing.assert_array_equal(mf.dequantize("embeddings.weight"), first)


def test_native_types_held_wider_than_the_file_count_as_held(files):
    from s2core.runtime.memory import resident_weight_bytes
    mf = files["q8_0"]
    plain = Capabilities(native_weight_types=frozenset({"f32", "q8_0"}))
    wider = Capabilities(native_weight_types=frozenset({"f32", "q8_0"}),
                         native_weight_overhead=(("q8_0", 1.5),))
    q8 = sum(t.n_bytes for t in mf.model_tensors() if t.type_name == "q8_0")
    assert resident_weight_bytes(mf, wider) - resident_weight_bytes(mf, plain) == pytest.approx(
        0.5 * q8, abs=len(list(mf.model_tensors())))
