"""Replay a scenario s2.cpp itself computed (a folder of scenario.json and .npy files) on a
loaded s2core model, and measure every output against s2.cpp's.

The folders are tests/data/s2cpp_vector/ (the shared F32 vector) and tests/data/s2cpp_fidelity/
(F16 and Q8_0 files); both READMEs describe the layout. The measure is the issue's:
max|out - ref| / max|ref| per output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: the chunk size of the chunked prefill; s2.cpp's chunked goldens used the same
CHUNK = 7


def max_rel(out, ref) -> float:
    return float(np.abs(np.asarray(out, np.float64) - ref).max() / np.abs(ref).max())


def calls(folder: Path) -> list[dict]:
    return json.loads((folder / "scenario.json").read_text())["calls"]


def replay(m, folder: Path, prefill: str) -> dict[str, float]:
    """Run the folder's calls on model `m` and return {"<call> <output>": error}.

    prefill "prefill_fast": the prompt in one call; "prefill_chunked": prefill(chunk_size=7),
    whose chunks are joined through the F16 cache as s2.cpp's successive calls are. A fast
    call fed "the hidden of the previous call" gets s2.cpp's vector, and ours is measured
    against it too (`<call> hidden_in`).
    """
    errors: dict[str, float] = {}
    last_hidden = None
    for call in calls(folder):
        op, i = call["op"], call["i"]
        assert call["ok"], "the vectors hold successful calls only"
        if op == "init_kv_cache":
            m.init_kv_cache(call["max_seq_len"])
        elif op in ("prefill_fast", "step"):
            assert m.n_past == call["n_past_before"]
            tokens = np.load(folder / call["tokens"])
            if op == "step":
                r = m.step(tokens[0])
            elif prefill == "prefill_fast":
                r = m.prefill_fast(tokens)
            else:
                r = m.prefill(tokens, chunk_size=CHUNK)
            assert m.n_past == call["n_past_after"]
            errors[f"{i} hidden"] = max_rel(r.hidden, np.load(folder / call["hidden"]))
            errors[f"{i} logits"] = max_rel(r.logits, np.load(folder / call["logits"]))
            last_hidden = r.hidden
        elif op == "dump_kv":
            k, v = m.kv_cache_snapshot()
            ref_k = np.load(folder / call["k_cache"]).astype(np.float32)
            ref_v = np.load(folder / call["v_cache"]).astype(np.float32)
            assert k.shape == ref_k.shape
            errors[f"{i} K"] = max_rel(k, ref_k)
            errors[f"{i} V"] = max_rel(v, ref_v)
        elif op == "fast_decode":
            hidden = np.load(folder / call["hidden_in"])
            if call["hidden_source"] != "file":
                errors[f"{i} hidden_in"] = max_rel(last_hidden, hidden)
            out = m.fast_decode(hidden, np.load(folder / call["prefix"]))
            errors[f"{i} fast"] = max_rel(out, np.load(folder / call["fast_logits"]))
        else:
            raise AssertionError(f"unknown op {op}")
    return errors


def worst(errors: dict[str, float]) -> tuple[str, float]:
    name = max(errors, key=errors.get)
    return name, errors[name]
