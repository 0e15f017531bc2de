"""What each measured operation must do: bytes it reads, FLOPs it performs, and its floor.

Decode step (one position). It multiplies one vector by every Slow-AR layer matrix (wqkv, wo,
w1, w3, w2) and by the tied embeddings matrix (the logits). Each weight is read once and used
for 2 FLOPs, far below what a CPU computes per byte loaded, so a step is memory-bound: it cannot
be faster than (bytes of those matrices, in the file's type) / memory bandwidth. The codebook
table (a few rows gathered), the Fast-AR (not part of a step), norms and the KV cache (256
positions x 4 layers x 8 KiB, ~1 % of the weights here) are left out of the floor.

A backend that widens a type on load (NumPy computes from float32 copies of f16/q8_0 weights)
streams more bytes than the file holds; `resident_step_bytes` counts those, so the output can
say how much of the gap to the floor is the widening itself.

Prefill FLOPs for n tokens into an empty cache (documented in benchmarks/README.md):
    matmuls    2 * n * n_layer * (params of wqkv + wo + w1 + w3 + w2)
    attention  n_layer * 2 * n_head * head_dim * n * (n + 1)
               (query i sees i + 1 keys: q.k and p.v cost 2 * head_dim FLOPs each per key)
    logits     2 * vocab * dim (once: only the last position is projected)
Element-wise work (norms, RoPE, softmax, SwiGLU) is not counted.

Fast-AR frame: num_codebooks - 1 calls of fast_decode (prefix lengths 1..9 for S2 Pro), each
reading every Fast-AR layer matrix and fast_output once, so its floor is that many times
their bytes over the bandwidth.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from s2core.modelfile.file import ModelFile
from s2core.modelfile.hparams import Hparams

LAYER_MATRICES = ("attention.wqkv", "attention.wo", "feed_forward.w1", "feed_forward.w3",
                  "feed_forward.w2")
DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2}


def step_tensor_names(hp: Hparams) -> list[str]:
    """Tensors a decode step streams from memory in full."""
    names = [f"layers.{i}.{m}.weight" for i in range(hp.n_layer) for m in LAYER_MATRICES]
    return names + ["embeddings.weight"]


def fast_call_tensor_names(hp: Hparams) -> list[str]:
    """Tensors one fast_decode call streams in full (the embedding rows it gathers aside)."""
    f = hp.fast
    if f is None:
        return []
    names = [f"fast_layers.{i}.{m}.weight" for i in range(f.n_layer) for m in LAYER_MATRICES]
    names.append("fast_output.weight")
    if f.project_in:
        names.append("fast_project_in.weight")
    return names


def sampled_rows(hp: Hparams) -> int:
    """Rows of the output matrix a generation step asks for: the semantic ids and
    <|im_end|> (s2core/generation/frame.py)."""
    return min(hp.semantic_end_id, hp.vocab_size - 1) - hp.semantic_begin_id + 2


def fast_calls_per_frame(hp: Hparams) -> int:
    """fast_decode calls per generated frame: codes 1..num_codebooks-1 (code 0 is the token)."""
    return hp.num_codebooks - 1


def layer_matrix_params(hp: Hparams) -> int:
    """Parameters of one Slow-AR layer's matrices."""
    return (hp.q_size + 2 * hp.kv_size) * hp.dim + hp.dim * hp.q_size + 3 * hp.ffn * hp.dim


def prefill_flops(hp: Hparams, n: int, context: int = 0) -> int:
    """FLOPs of a prefill of n tokens after `context` cached positions (a restored voice
    prefix; 0: an empty cache). Formula in the module docstring; query i sees context + i + 1
    keys, so the cached positions add n_layer * 4 * n_head * head_dim * n * context."""
    matmuls = 2 * n * hp.n_layer * layer_matrix_params(hp)
    attention = hp.n_layer * 2 * hp.n_head * hp.head_dim * (n * (n + 1) + 2 * n * context)
    logits = 2 * hp.vocab_size * hp.dim
    return matmuls + attention + logits


def kv_cache_bytes(hp: Hparams, positions: int, dtype: str) -> int:
    """K and V of every layer for `positions` rows."""
    return 2 * hp.n_layer * positions * hp.kv_size * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class ModelAccount:
    """The byte counts of one model file that the derived figures need."""

    weight_type: str
    path: str
    file_bytes: int
    weight_bytes: int             # tensors s2core uses (ModelFile.weight_bytes)
    step_read_bytes: int          # file-type bytes a decode step must stream
    #: ... when it computes only the logits generation samples from (contract.md, "Logit
    #: rows"): the output matrix's semantic and <|im_end|> rows instead of all of them
    sampled_step_read_bytes: int
    step_params: int              # parameters in those tensors
    fast_frame_read_bytes: int    # file-type bytes a Fast-AR frame must stream (all its calls)
    fast_calls_per_frame: int
    prefill_flops: int
    tensor_types: dict[str, int]  # GGUF type name -> number of tensors of that type

    def as_dict(self) -> dict:
        return asdict(self)


def account(mf: ModelFile, weight_type: str, prefill_tokens: int) -> ModelAccount:
    hp = mf.hparams
    step = [mf.info(n) for n in step_tensor_names(hp)]
    fast = [mf.info(n) for n in fast_call_tensor_names(hp)]
    calls = fast_calls_per_frame(hp)
    output = mf.info("embeddings.weight")
    types: dict[str, int] = {}
    for t in mf.model_tensors():
        types[t.type_name] = types.get(t.type_name, 0) + 1
    return ModelAccount(
        weight_type=weight_type, path=str(mf.path), file_bytes=mf.file_size,
        weight_bytes=mf.weight_bytes, step_read_bytes=sum(t.n_bytes for t in step),
        sampled_step_read_bytes=sum(t.n_bytes for t in step) - output.n_bytes
        + output.n_bytes * sampled_rows(hp) // hp.vocab_size,
        step_params=sum(t.n_elements for t in step),
        fast_frame_read_bytes=calls * sum(t.n_bytes for t in fast), fast_calls_per_frame=calls,
        prefill_flops=prefill_flops(hp, prefill_tokens), tensor_types=types)


def _resident_bytes(infos, native_types: list[str], widened_dtype: str,
                    overhead: dict[str, float] | None = None) -> int:
    """`overhead`: held bytes per file byte of native types not held byte for byte
    (Capabilities.native_weight_overhead)."""
    overhead = overhead or {}
    return sum(int(t.n_bytes * overhead.get(t.type_name, 1.0)) if t.type_name in native_types
               else t.n_elements * DTYPE_BYTES[widened_dtype] for t in infos)


def resident_step_bytes(mf: ModelFile, native_types: list[str], widened_dtype: str,
                        overhead: dict[str, float] | None = None) -> int:
    """Bytes a step streams on a backend that keeps `native_types` as stored and widens the rest."""
    return _resident_bytes((mf.info(n) for n in step_tensor_names(mf.hparams)), native_types,
                           widened_dtype, overhead)


def resident_weight_bytes(mf: ModelFile, native_types: list[str], widened_dtype: str,
                          overhead: dict[str, float] | None = None) -> int:
    """Weight bytes such a backend holds after load (every tensor s2core uses)."""
    return _resident_bytes(mf.model_tensors(), native_types, widened_dtype, overhead)


def floor_ms(n_bytes: int, gbps: float) -> float:
    """Time to stream n_bytes at gbps (1e9 bytes/s), in milliseconds."""
    return n_bytes / (gbps * 1e9) * 1e3
