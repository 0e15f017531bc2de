"""The tiny models the conformance matrix runs on, written once per process.

Four shapes cover the variations SPEC allows (head_dim != dim/n_head, GQA 4/2/1, QK-norm on
and off, codebook scaling on and off, Fast-AR with and without project_in, other codebook
counts, a Fast-AR whose RoPE base, eps and heads all differ from the Slow-AR's), each in
several GGUF weight types, K-quants included.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from s2core.modelfile.file import ModelFile
from s2core.modelfile.hparams import FastHparams, Hparams
from s2core.embedded.writer import tiny_hparams, write_model
from s2core.kit.reference import Reference

CONFIGS: dict[str, Hparams] = {
    # The shared s2.cpp vector's shape: GQA 4, head_dim 32 (dim/n_head would say 16), QK-norm.
    "gqa4": tiny_hparams(),
    # GQA 2, no QK-norm (head_dim from wo: 96/4 = 24), no codebook scaling, another RoPE base,
    # Fast-AR narrower than the Slow-AR (project_in) with one KV head and no QK-norm.
    "gqa2-noqk": replace(
        tiny_hparams(), vocab_size=150, semantic_begin_id=100, semantic_end_id=139,
        codebook_size=16, n_head=4, n_head_kv=2, head_dim=24, attention_qk_norm=False,
        scale_codebook_embeddings=False, rope_freq_base=10000.0, rms_norm_eps=1e-5,
        fast=FastHparams(context_length=11, dim=48, ffn=96, n_layer=2, n_head=2, n_head_kv=1,
                         head_dim=32, rope_freq_base=10000.0, rms_norm_eps=1e-5,
                         attention_qk_norm=False, project_in=True)),
    # Plain multi-head attention (GQA 1) with rows of 256 so K-quants apply; 4 codebooks.
    "mha-k": replace(
        tiny_hparams(), context_length=2048, vocab_size=300, semantic_begin_id=200,
        semantic_end_id=263, codebook_size=64, num_codebooks=4, dim=256, ffn=512, n_head=4,
        n_head_kv=4, head_dim=64,
        fast=FastHparams(context_length=5, dim=256, ffn=512, n_layer=1, n_head=4, n_head_kv=2,
                         head_dim=64, attention_qk_norm=False, project_in=False)),
    # A Fast-AR whose every attention hyperparameter differs from the Slow-AR's: RoPE base 100
    # (Slow-AR 1e6), eps 1e-2 (1e-6), 8 query and 2 KV heads of 16 (4 and 1 of 32), QK-norm on
    # both; a backend that reads any of them from the Slow-AR's hparams gives other numbers.
    "fast-own": replace(
        tiny_hparams(),
        fast=FastHparams(context_length=11, dim=64, ffn=128, n_layer=2, n_head=8, n_head_kv=2,
                         head_dim=16, rope_freq_base=100.0, rms_norm_eps=1e-2,
                         attention_qk_norm=True, project_in=False)),
    # The gqa4 shape with a context of 2**31 - 1 positions: a full cache would take a
    # terabyte, so init_kv_cache(context_length) must be refused, the previous cache kept.
    "huge-context": tiny_hparams(context_length=2**31 - 1),
}

#: (config, weight type) pairs of the numerical matrix
MATRIX: list[tuple[str, str]] = [
    ("gqa4", "f32"), ("gqa4", "f16"), ("gqa4", "bf16"), ("gqa4", "q8_0"), ("gqa4", "q4_0"),
    ("gqa2-noqk", "f32"), ("gqa2-noqk", "q5_1"), ("gqa2-noqk", "q4_1"), ("gqa2-noqk", "q5_0"),
    ("mha-k", "f16"), ("mha-k", "q4_k"), ("mha-k", "q5_k"), ("mha-k", "q6_k"),
    ("mha-k", "q3_k"), ("mha-k", "q2_k"),
    # mixed files (s2-pro-q4_k_m.gguf's recipe): Q4_K/Q5_K with Q6_K tensors, each its own type
    ("mha-k", "q4_k_m"), ("mha-k", "q5_k_m"),
]
MATRIX_IDS = [f"{c}-{t}" for c, t in MATRIX]


@functools.lru_cache(maxsize=None)
def scratch_directory(prefix: str = "s2core-kit-") -> Path:
    """A temporary directory for the kit's files, one per prefix and process, removed at
    exit."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.lru_cache(maxsize=None)
def kit_model(config: str = "gqa4", weight_type: str = "f32") -> Path:
    """Path of the kit's model file for (config, weight type), written on first use."""
    path = scratch_directory() / f"{config}-{weight_type}.gguf"
    write_model(path, CONFIGS[config], weight_type, seed=7, include_codec=True)
    return path


@functools.lru_cache(maxsize=None)
def kit_reference(config: str = "gqa4", weight_type: str = "f32", arithmetic: str = "f32"
                  ) -> Reference:
    """The float64 reference of the same file, in an arithmetic ("f32" or "ggml")."""
    return Reference(ModelFile(kit_model(config, weight_type)), arithmetic)
