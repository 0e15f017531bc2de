"""A corpus of hostile GGUF files, each derived from one valid model with one thing broken:
every one loads to a ModelFileError naming its check, in well under a second, with bounded
memory (measured in a fresh process) and a message of bounded size.

Truncations are made at every section boundary (and one byte either side) and at random
points; the rest flip metadata types, store unusable hparams, forge counts and lengths, and
move tensor offsets (unaligned, wrapped, past the end, overlapping).
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

import s2core
from s2core import ModelFileError
from s2core.embedded.writer import tiny_hparams, write_model

from gguf_surgery import Parts, encode_kv, encode_string, nbytes, parse

A, E = "fish-speech", "fish_speech"
#: the issue's bounds for one hostile file
MAX_SECONDS = 1.0
MAX_PEAK_BYTES = 200 * 2**20
MAX_MESSAGE = 2000


@dataclass
class Case:
    name: str
    data: bytes
    checks: tuple[str, ...] | None  # acceptable ModelFileError.check values (None: any)


@pytest.fixture(scope="module")
def valid_parts(tmp_path_factory) -> Parts:
    """The tiny model with codec keys and tensors, plus a small tokenizer-like string array
    and an integer array (real files carry both)."""
    path = tmp_path_factory.mktemp("hostile") / "valid.gguf"
    write_model(path, tiny_hparams(), "f32", seed=1, include_codec=True)
    parts = parse(path.read_bytes())
    parts = parts.set_kv("tokenizer.ggml.tokens", encode_kv(
        "tokenizer.ggml.tokens", VT.ARRAY, [f"tok{i}" for i in range(300)], VT.STRING))
    return parts.set_kv("tokenizer.ggml.token_type", encode_kv(
        "tokenizer.ggml.token_type", VT.ARRAY, list(range(300)), VT.INT32))


def test_the_rebuilt_valid_file_loads(valid_parts, tmp_path):
    path = tmp_path / "rebuilt.gguf"
    path.write_bytes(valid_parts.build())
    mf = s2core.ModelFile(path)
    assert mf.hparams.n_layer == 2
    assert mf.container.get_array("tokenizer.ggml.tokens", str)[299] == "tok299"
    assert mf.container.get_array("tokenizer.ggml.token_type", int).tolist() == list(range(300))


def truncations(parts: Parts) -> list[Case]:
    data = parts.build()
    end = parts.boundaries["data"] + parts.data_end()  # past it there is only padding
    cuts = set()
    for at in parts.boundaries.values():
        cuts.update({at - 1, at, at + 1})
    cuts.update(int(c) for c in np.random.default_rng(0).integers(0, end, 60))
    return [Case(f"truncated at byte {c}", data[:c], ("truncated",))
            for c in sorted(cuts) if 0 <= c < end]


def metadata_cases(p: Parts) -> list[Case]:
    def kv(key, vtype, value, checks, elem=None, label=None):
        return Case(label or f"{key} = {vtype.name} {value!r}"[:80],
                    p.set_kv(key, encode_kv(key, vtype, value, elem)).build(), checks)

    mt, mv, hp = ("metadata_type",), ("metadata_value",), ("hparams",)
    cases = [
        kv(f"{A}.block_count", VT.FLOAT32, 64.9, mt),
        kv(f"{A}.block_count", VT.FLOAT32, math.nan, mt),
        kv(f"{A}.block_count", VT.STRING, "2", mt),
        kv(f"{A}.block_count", VT.BOOL, True, mt),
        kv(f"{A}.context_length", VT.FLOAT64, 4096.0, mt),
        kv(f"{E}.tie_word_embeddings", VT.STRING, "false", mt),
        kv(f"{E}.attention_qk_norm", VT.UINT8, 1, mt),
        kv(f"{E}.attention_qk_norm", VT.BOOL, 2, mv),
        kv(f"{A}.rope.freq_base", VT.FLOAT32, math.nan, mv),
        kv(f"{A}.rope.freq_base", VT.FLOAT64, math.inf, mv),
        kv(f"{A}.attention.layer_norm_rms_epsilon", VT.STRING, "1e-6", mt),
        kv(f"{E}.fast_layer_norm_rms_eps", VT.FLOAT32, -math.inf, mv),
        kv("general.architecture", VT.UINT32, 7, mt),
        kv("general.alignment", VT.UINT64, 32, mt),
        kv("general.alignment", VT.UINT32, 3, ("alignment",)),
        kv("general.alignment", VT.UINT32, 0, ("alignment",)),
        kv(f"{A}.vocab_size", VT.ARRAY, [200, 200], mt, VT.UINT32),
        # usable types, unusable values: refused at load whatever the backend
        kv(f"{A}.context_length", VT.UINT32, 0, hp),
        kv(f"{A}.context_length", VT.UINT64, 2**40, hp),
        kv(f"{A}.attention.head_count", VT.UINT32, 0, hp),
        kv(f"{A}.attention.head_count_kv", VT.UINT32, 0, hp),
        kv(f"{A}.attention.head_count_kv", VT.UINT32, 3, hp),
        kv(f"{A}.embedding_length", VT.UINT32, 0, hp),
        kv(f"{A}.vocab_size", VT.INT32, -5, hp),
        kv(f"{E}.num_codebooks", VT.UINT32, 0, hp),
        kv(f"{E}.semantic_end_id", VT.UINT32, 200, hp),
        kv(f"{A}.rope.freq_base", VT.FLOAT32, 0.0, hp),
        kv(f"{A}.attention.layer_norm_rms_epsilon", VT.FLOAT32, -1e-6, hp),
        kv(f"{E}.fast_context_length", VT.UINT32, 0, hp),
        kv(f"{E}.fast_context_length", VT.UINT32, 1, hp),
        kv(f"{E}.fast_head_count", VT.UINT32, 0, hp),
        kv(f"{A}.block_count", VT.UINT32, 2**32 - 1, hp),
        kv(f"{A}.block_count", VT.UINT32, 2**31 - 1, ("tensor_count",)),
        kv(f"{A}.block_count", VT.UINT32, 100000, ("tensor_count",)),
        kv(f"{E}.fast_block_count", VT.UINT32, 5000, ("tensor_count",)),
        kv(f"{A}.block_count", VT.UINT32, 3, ("tensors",)),  # layer 2's tensors are missing
    ]
    # raw entries the encoder would not write
    key = b"weird.key"
    raw = {
        "unknown value type 99": (encode_string(key) + struct.pack("<II", 99, 0), mt),
        "array of arrays": (encode_string(key) + struct.pack("<IIQ", VT.ARRAY, VT.ARRAY, 1)
                            + struct.pack("<IQ", VT.UINT8, 1) + b"\x01", mt),
        "key not UTF-8": (encode_string(b"\xff\xfe") + struct.pack("<IB", VT.UINT8, 1), ("utf8",)),
        "key length 2**63": (struct.pack("<Q", 2**63) + key, ("bounds",)),
        "string value length 2**40": (encode_string(key) + struct.pack("<IQ", VT.STRING, 2**40),
                                      ("bounds",)),
        "array of 5e7 UINT32 with no data": (
            encode_string(key) + struct.pack("<IIQ", VT.ARRAY, VT.UINT32, 50_000_000), ("bounds",)),
        "array of 1e6 UINT64 with no data": (
            encode_string(key) + struct.pack("<IIQ", VT.ARRAY, VT.UINT64, 1_000_000),
            ("truncated",)),
        "array of 1e6 strings with no data": (
            encode_string(key) + struct.pack("<IIQ", VT.ARRAY, VT.STRING, 1_000_000),
            ("truncated",)),
    }
    for name, (entry, checks) in raw.items():
        q = p.copy()
        q.kvs.insert(3, ("weird.key", entry))
        cases.append(Case(name, q.build(), checks))
    q = p.copy()
    q.kvs.append(q.kvs[2])
    cases.append(Case("duplicate key", q.build(), ("duplicate_key",)))
    return cases


def count_cases(p: Parts) -> list[Case]:
    b = ("bounds",)
    return [
        Case("tensor count 2**32-1", p.build(n_tensors=2**32 - 1), b),
        Case("tensor count 2**64-1", p.build(n_tensors=2**64 - 1), b),
        Case("key count 2**63", p.build(n_kv=2**63), b),
        Case("tensor count 60000", p.build(n_tensors=60000), ("truncated",)),
        Case("key count 1000 (garbage after the real ones)", p.build(n_kv=1000), None),
        Case("bad magic", p.build(magic=b"GGUG"), ("magic",)),
        Case("version 1", Parts(1, p.kvs, p.tensors, p.data).build(), ("version",)),
        Case("big-endian version", Parts(3 << 24, p.kvs, p.tensors, p.data).build(),
             ("version",)),
        Case("empty file", b"", ("truncated",)),
    ]


def tensor_cases(p: Parts) -> list[Case]:
    by_offset = sorted(p.tensors, key=lambda t: t.offset)
    first, second, last = by_offset[0], by_offset[1], by_offset[-1]

    def changed(label, checks, **fields):
        name = fields.pop("name_of", first.name)
        q = p.copy()
        for t in q.tensors:
            if t.name == name:
                for k, v in fields.items():
                    setattr(t, k, v)
        return Case(label, q.build(), checks)

    big = next(t for t in by_offset[:-1] if math.prod(t.dims) > 1000)
    norm = p.tensor("layers.0.attention.q_norm.weight")
    return [
        changed("offset unaligned", ("tensor_offset",), offset=first.offset + 1),
        changed("offset wraps (2**64 - 32)", ("tensor_offset",), offset=2**64 - 32),
        changed("offset far past the end", ("tensor_offset",),
                offset=p.data_end() + 4096 * p.alignment),
        changed("two tensors at one offset", ("tensor_overlap",), name_of=second.name,
                offset=first.offset),
        changed("offset inside another tensor", ("tensor_overlap",), name_of=second.name,
                offset=first.offset + p.alignment) if nbytes(first) > p.alignment else
        changed("offset inside another tensor", ("tensor_overlap",), name_of=big.name,
                offset=big.offset + p.alignment),
        changed("F32 stored as F64 (twice the bytes)", ("tensor_overlap",), name_of=big.name,
                type=int(QT.F64)),
        changed("last tensor's size doubled", ("truncated",), name_of=last.name,
                dims=[last.dims[0] * 2] + last.dims[1:]),
        changed("dims 2**62 x 2**62", ("tensor_offset",), dims=[2**62, 2**62]),
        changed("5 dimensions", ("tensor_shape",), dims=first.dims + [1] * (5 - len(first.dims))),
        changed("0 dimensions", ("tensor_shape",), dims=[]),
        changed("unknown GGML type 9999", ("tensor_type",), type=9999),
        changed("Q4_K rows of 64 (block 256)", ("tensor_shape",), name_of=big.name,
                type=int(QT.Q4_K)),
        changed("duplicate tensor name", ("duplicate_tensor",), name_of=second.name,
                name=first.name),
        changed("tensor name not UTF-8", ("utf8",), name=b"\xff" * 5),
        changed("head_dim 0 (an empty q_norm)", ("hparams",), name_of=norm.name, dims=[0]),
        changed("missing tensor (renamed)", ("tensors",), name_of=big.name,
                name=b"x" * len(big.name)),
        changed("wrong shape (transposed)", ("tensors",), name_of=big.name,
                dims=list(reversed(big.dims))),
    ]


def name_length_case(p: Parts) -> Case:
    q = p.copy()
    data = bytearray(q.build())
    at = q.boundaries[f"tensor info {q.tensors[0].name.decode()}"]
    data[at:at + 8] = struct.pack("<Q", 2**40)
    return Case("tensor name length 2**40", bytes(data), ("bounds",))


@pytest.fixture(scope="module")
def corpus(valid_parts) -> list[Case]:
    p = valid_parts
    return (truncations(p) + metadata_cases(p) + count_cases(p) + tensor_cases(p)
            + [name_length_case(p)])


#: Loads each file with s2core.load in a fresh process, twice: first for the outcome, the time
#: and the process's peak resident memory (VmHWM), then under tracemalloc (which numpy's
#: allocations report to) for each file's Python peak; tracing costs memory of its own, so it
#: stays out of the resident figure.
_MEASURE = textwrap.dedent("""
    import json, resource, sys, time, tracemalloc, warnings
    import s2core
    warnings.simplefilter("ignore")
    s2core.list_backends()  # discovery and probes once, before the clock runs

    def peak_resident_bytes():
        # VmHWM: this process's own peak (ru_maxrss would carry over the parent's from fork)
        try:
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def attempt(path):
        try:
            s2core.load(path, backend="numpy")
            return "loaded", "", ""
        except BaseException as exc:
            return type(exc).__name__, getattr(exc, "check", ""), str(exc)

    out = {}
    for path in sys.argv[1:]:
        t0 = time.perf_counter()
        kind, check, message = attempt(path)
        out[path] = dict(type=kind, check=check, message=message[:3000],
                         message_length=len(message), seconds=time.perf_counter() - t0)
    maxrss = peak_resident_bytes()
    for path in sys.argv[1:]:
        tracemalloc.start()
        attempt(path)
        out[path]["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    print(json.dumps(dict(cases=out, maxrss=maxrss)))
""")


def test_every_hostile_file_is_a_named_model_file_error_fast_and_small(corpus, tmp_path):
    paths = {}
    for i, case in enumerate(corpus):
        paths[str(tmp_path / f"case{i:03d}.gguf")] = case
    for path, case in paths.items():
        with open(path, "wb") as f:
            f.write(case.data)
    run = subprocess.run([sys.executable, "-c", _MEASURE, *paths], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.splitlines()[-1])
    wrong = []
    for path, case in paths.items():
        r = report["cases"][path]
        if r["type"] != "ModelFileError" or (case.checks and r["check"] not in case.checks):
            wrong.append(f"{case.name}: {r['type']} [{r['check']}] {r['message'][:300]} "
                         f"(expected {case.checks})")
        elif r["seconds"] > MAX_SECONDS or r["peak"] > MAX_PEAK_BYTES:
            wrong.append(f"{case.name}: {r['seconds']:.3f} s, peak {r['peak'] / 2**20:.1f} MB")
        elif r["message_length"] > MAX_MESSAGE:
            wrong.append(f"{case.name}: message of {r['message_length']} characters")
    assert not wrong, f"{len(wrong)} of {len(paths)} cases:\n" + "\n".join(wrong)
    slowest = max(report["cases"].values(), key=lambda r: r["seconds"])
    peak = max(r["peak"] for r in report["cases"].values())
    print(f"{len(paths)} hostile files: slowest {slowest['seconds'] * 1e3:.1f} ms, Python peak "
          f"{peak / 2**20:.2f} MB, process max RSS {report['maxrss'] / 2**20:.0f} MB")
    assert report["maxrss"] < MAX_PEAK_BYTES


def test_corpus_covers_every_section(corpus):
    """The truncations cut inside the header, every metadata entry, every tensor info, the
    padding and the data of every tensor."""
    names = " ".join(c.name for c in corpus)
    assert len(corpus) > 150, len(corpus)
    assert "truncated at byte 0" in names and "empty file" in names


def test_unusable_hparams_fail_the_same_on_every_backend(valid_parts, tmp_path):
    """The check runs in the core at load, before a backend is constructed."""
    key = f"{A}.context_length"
    path = tmp_path / "ctx0.gguf"
    path.write_bytes(valid_parts.set_kv(key, encode_kv(key, VT.UINT32, 0)).build())
    messages = set()
    for row in s2core.list_backends():
        if not row.available:
            continue
        with pytest.raises(ModelFileError) as info:
            s2core.load(path, backend=row.name)
        assert info.value.check == "hparams"
        messages.add(str(info.value))
    assert len(messages) == 1 and "context_length=0 is outside [1, " in messages.pop()


def test_not_a_regular_file(tmp_path):
    with pytest.raises(ModelFileError) as info:
        s2core.load(tmp_path)
    assert info.value.check == "not_regular_file" and "directory" in str(info.value)
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)  # opening it for reading would block until a writer came
    with pytest.raises(ModelFileError) as info:
        s2core.load(fifo)
    assert info.value.check == "not_regular_file" and "FIFO" in str(info.value)
    with pytest.raises(ModelFileError) as info:
        s2core.load(tmp_path / "absent.gguf")
    assert info.value.check == "not_found"


@pytest.mark.parametrize("bad", [None, 3, b"a.gguf", ["a.gguf"]])
def test_load_of_a_non_path_is_an_input_error(bad):
    with pytest.raises(s2core.InvalidInputError) as info:
        s2core.load(bad)
    assert info.value.check == "path_type"
