"""Randomized: bytes of a valid model file mutated by hypothesis either load to a fully usable
ModelFile or fail with a ModelFileError, never another exception, each within a deadline.

Bounded for CI: a fixed example count, a per-example deadline and derandomized generation
(the same examples on every run); raise S2CORE_FUZZ_EXAMPLES to search longer locally.
"""

from __future__ import annotations

import os
import struct
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s2core import ModelFile, ModelFileError
from s2core.embedded.writer import tiny_hparams, write_model

from gguf_surgery import parse

EXAMPLES = int(os.environ.get("S2CORE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=1000, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
#: values that break counts, lengths and offsets, written over 4- or 8-byte fields
EDGE_VALUES = [0, 1, 2, 3, 31, 33, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62,
               2**63 - 1, 2**63, 2**64 - 1]


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """(bytes of a valid model, the offsets where its sections and fields start, a scratch path)"""
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "valid.gguf"
    write_model(path, tiny_hparams(), "q8_0", seed=2, include_codec=True)
    parts = parse(path.read_bytes())
    data = parts.build()
    return data, sorted(set(parts.boundaries.values())), parts.boundaries["data"], folder / "m.gguf"


@st.composite
def mutated(draw, original):
    data, boundaries, header_end, _ = original
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["byte", "field", "truncate", "delete", "insert"]))
        # most mutations land in the header, where the structure is; some anywhere
        limit = header_end if draw(st.integers(0, 9)) else len(out)
        at = draw(st.integers(0, max(0, min(limit, len(out)) - 1)))
        if kind == "byte":
            if out:
                out[at] = draw(st.integers(0, 255))
        elif kind == "field":
            at = draw(st.sampled_from(boundaries)) + draw(st.integers(0, 24))
            fmt = draw(st.sampled_from(["<I", "<Q"]))
            value = draw(st.sampled_from(EDGE_VALUES)) % (2 ** (8 * struct.calcsize(fmt)))
            packed = struct.pack(fmt, value)
            out[at:at + len(packed)] = packed
        elif kind == "truncate":
            del out[at:]
        elif kind == "delete":
            del out[at:at + draw(st.integers(1, 16))]
        else:
            out[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(out)


def check_outcome(data: bytes, path) -> None:
    path.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a mutated key name is a missing key: a warning
        try:
            mf = ModelFile(path)
        except ModelFileError as exc:
            assert len(str(exc)) < 2000, "message of unbounded size"
            return
    try:
        # Loaded: then it is whole. Every tensor the layout needs is readable in bounds.
        mf.hparams.validate()
        for t in mf.model_tensors():
            assert mf.raw(t.name).nbytes == t.n_bytes
    finally:
        mf.close()


def test_mutated_files_load_or_fail_cleanly(original):
    @FUZZ
    @given(mutated(original))
    def run(data):
        check_outcome(data, original[3])
    run()
