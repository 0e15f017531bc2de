"""The s2.cpp tensor layout (SPEC section 1): every tensor name with its PyTorch-order shape.

One source of truth shared by the loader (which checks files against it) and the test-model
writer (which produces files from it). GGUF stores dims reversed; that is the loader's concern.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from s2core.modelfile.hparams import FastHparams, Hparams

Shape = tuple[int, ...]


def _block_tensors(prefix: str, dim: int, ffn: int, n_head: int, n_head_kv: int, head_dim: int,
                   qk_norm: bool) -> dict[str, Shape]:
    q, kv = n_head * head_dim, n_head_kv * head_dim
    t = {
        f"{prefix}.attention_norm.weight": (dim,),
        f"{prefix}.ffn_norm.weight": (dim,),
        f"{prefix}.attention.wqkv.weight": (q + 2 * kv, dim),
        f"{prefix}.attention.wo.weight": (dim, q),
        f"{prefix}.feed_forward.w1.weight": (ffn, dim),
        f"{prefix}.feed_forward.w3.weight": (ffn, dim),
        f"{prefix}.feed_forward.w2.weight": (dim, ffn),
    }
    if qk_norm:
        t[f"{prefix}.attention.q_norm.weight"] = (head_dim,)
        t[f"{prefix}.attention.k_norm.weight"] = (head_dim,)
    return t


#: a block's matrices and gain vectors: attribute name -> tensor name below the block's prefix
BLOCK_MATRICES = {"wqkv": "attention.wqkv", "wo": "attention.wo", "w1": "feed_forward.w1",
                  "w3": "feed_forward.w3", "w2": "feed_forward.w2"}
BLOCK_NORMS = {"attn_norm": "attention_norm", "ffn_norm": "ffn_norm"}
BLOCK_QK_NORMS = {"q_norm": "attention.q_norm", "k_norm": "attention.k_norm"}


@dataclass(frozen=True)
class BlockWeights:
    """One transformer block's tensors in a backend's own types (matrices [out, in] as the
    backend keeps them, norm vectors; the QK norms None without QK-norm). Every backend's
    blocks are this record, filled by `load_block`."""

    attn_norm: Any
    ffn_norm: Any
    wqkv: Any
    wo: Any
    w1: Any
    w3: Any
    w2: Any
    q_norm: Any
    k_norm: Any

    def matrices(self) -> list:
        """The five projection matrices."""
        return [self.wqkv, self.wo, self.w1, self.w3, self.w2]


def load_block(prefix: str, qk_norm: bool, matrix: Callable[[str], Any],
               vector: Callable[[str], Any]) -> BlockWeights:
    """One block's weights, each loaded by the backend's own `matrix(name)` or
    `vector(name)`."""
    out = {attr: matrix(f"{prefix}.{name}.weight") for attr, name in BLOCK_MATRICES.items()}
    out.update((attr, vector(f"{prefix}.{name}.weight")) for attr, name in BLOCK_NORMS.items())
    out.update((attr, vector(f"{prefix}.{name}.weight") if qk_norm else None)
               for attr, name in BLOCK_QK_NORMS.items())
    return BlockWeights(**out)


class FastARWeights(NamedTuple):
    """The Fast-AR's weights in a backend's own types (see `load_fast_ar`)."""

    project_in: Any  # None when the Fast-AR's dim equals the Slow-AR's
    embeddings: Any
    norm: Any
    output: Any
    layers: list


def load_fast_ar(f: FastHparams, matrix: Callable[[str], Any], vector: Callable[[str], Any],
                 block: Callable[[str, bool], Any]) -> FastARWeights:
    """Every Fast-AR tensor through the backend's loaders: `block(prefix, qk_norm)` builds
    one layer (usually `load_block` with the same loaders)."""
    return FastARWeights(
        project_in=matrix("fast_project_in.weight") if f.project_in else None,
        embeddings=matrix("fast_embeddings.weight"), norm=vector("fast_norm.weight"),
        output=matrix("fast_output.weight"),
        layers=[block(f"fast_layers.{i}", f.attention_qk_norm) for i in range(f.n_layer)])


def layer_tensors(hp: Hparams, i: int) -> dict[str, Shape]:
    """The tensors of Slow-AR layer i."""
    return _block_tensors(f"layers.{i}", hp.dim, hp.ffn, hp.n_head, hp.n_head_kv, hp.head_dim,
                          hp.attention_qk_norm)


def fast_layer_tensors(f: FastHparams, i: int) -> dict[str, Shape]:
    """The tensors of Fast-AR layer i."""
    return _block_tensors(f"fast_layers.{i}", f.dim, f.ffn, f.n_head, f.n_head_kv, f.head_dim,
                          f.attention_qk_norm)


def expected_tensors(hp: Hparams) -> dict[str, Shape]:
    """Every tensor an s2.cpp model file holds for these hparams (codec tensors `c.*` aside)."""
    t: dict[str, Shape] = {
        "embeddings.weight": (hp.vocab_size, hp.dim),
        "codebook_embeddings.weight": (hp.num_codebooks * hp.codebook_size, hp.dim),
        "norm.weight": (hp.dim,),
    }
    for i in range(hp.n_layer):
        t.update(layer_tensors(hp, i))
    f = hp.fast
    if f is not None:
        if f.project_in:
            t["fast_project_in.weight"] = (f.dim, hp.dim)
        t["fast_embeddings.weight"] = (hp.codebook_size, f.dim)
        t["fast_norm.weight"] = (f.dim,)
        t["fast_output.weight"] = (hp.codebook_size, f.dim)
        for i in range(f.n_layer):
            t.update(fast_layer_tensors(f, i))
    return t


def is_norm(name: str) -> bool:
    """Norm weights are 1-D and stored F32 in real files whatever the file's weight type."""
    return name.endswith("norm.weight")


def is_codec(name: str) -> bool:
    """The audio codec's tensors live in the same file; the Slow-AR ignores them."""
    return name.startswith("c.")
