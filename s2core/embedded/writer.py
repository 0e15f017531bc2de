"""Write S2 Pro-layout GGUF files from random weights, exactly as s2.cpp reads them.

Used by the tests, the demo and the benchmarks (real weights cannot be downloaded here). Every
tensor's values come from its own RNG stream seeded by (seed, tensor name), so files of the
same config in different weight types hold the same underlying weights. Tensors are generated,
encoded and written one at a time: an S2 Pro-sized file never sits in memory whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from s2core.gguf.blocks import QUANTIZED_TYPES
from s2core.gguf.blocks import random_blocks as _random_blocks
from s2core.modelfile.hparams import ARCH_DEFAULT, EXT, FastHparams, Hparams
from s2core.modelfile.layout import expected_tensors, is_norm
from s2core.embedded.codec_writer import CodecConfig, add_codec_metadata, codec_plan, codec_tensor_values
from s2core.embedded.encoding import encode, tensor_rng, write_tensors

#: weight types the writer produces, by their file-name spelling
WEIGHT_TYPES: dict[str, QT] = {
    "f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0,
    "q4_0": QT.Q4_0, "q4_1": QT.Q4_1, "q5_0": QT.Q5_0, "q5_1": QT.Q5_1,
    "q2_k": QT.Q2_K, "q3_k": QT.Q3_K, "q4_k": QT.Q4_K, "q5_k": QT.Q5_K, "q6_k": QT.Q6_K,
}

#: mixed files, as the "_m" recipes of llama.cpp's quantizer write them (s2-pro-q4_k_m.gguf,
#: q5_k_m): (the base type, the type of the tensors given more bits). The more-bits tensors are
#: the tied embedding/output table and the feed-forward down projection (w2) of the layers
#: llama.cpp's `use_more_bits` picks (`more_bits_layer`); everything else takes the base type.
MIXED_TYPES: dict[str, tuple[QT, QT]] = {
    "q4_k_m": (QT.Q4_K, QT.Q6_K), "q5_k_m": (QT.Q5_K, QT.Q6_K),
}

#: general.file_type values (llama.cpp's LlamaFileType) for a file of one weight type
_FILE_TYPE = {
    "f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
    "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    "q5_0": gguf.LlamaFileType.MOSTLY_Q5_0, "q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
    "q2_k": gguf.LlamaFileType.MOSTLY_Q2_K, "q3_k": gguf.LlamaFileType.MOSTLY_Q3_K_M,
    "q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_M, "q5_k": gguf.LlamaFileType.MOSTLY_Q5_K_M,
    "q6_k": gguf.LlamaFileType.MOSTLY_Q6_K,
    "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M, "q5_k_m": gguf.LlamaFileType.MOSTLY_Q5_K_M,
}


# ---------------------------------------------------------------------- configs
def tiny_hparams(**overrides) -> Hparams:
    """The shared conformance model's shape: 2 layers, dim 64, GQA 4, head_dim 32 != dim/n_head."""
    fast = FastHparams(context_length=11, dim=64, ffn=128, n_layer=2, n_head=4, n_head_kv=2,
                       head_dim=32, attention_qk_norm=True, project_in=False)
    base = Hparams(context_length=4096, vocab_size=200, dim=64, ffn=128, n_layer=2, n_head=4,
                   n_head_kv=1, head_dim=32, codebook_size=32, num_codebooks=10,
                   semantic_begin_id=160, semantic_end_id=191, fast=fast)
    return replace(base, **overrides)


def demo_hparams() -> Hparams:
    """The demo's small model: S2 Pro's structure (GQA 4, head_dim != dim/n_head, QK-norm,
    a semantic range as wide as the codebook, 10 codebooks) at a size a laptop runs instantly."""
    fast = FastHparams(context_length=11, dim=256, ffn=768, n_layer=2, n_head=8, n_head_kv=2,
                       head_dim=32, attention_qk_norm=False, project_in=False)
    return Hparams(context_length=4096, vocab_size=8192, dim=256, ffn=768, n_layer=4, n_head=8,
                   n_head_kv=2, head_dim=64, codebook_size=1024, num_codebooks=10,
                   semantic_begin_id=4096, semantic_end_id=5119, fast=fast)


def s2pro_hparams(n_layer: int = 36, fast_n_layer: int = 4) -> Hparams:
    """S2 Pro's real dimensions (SPEC section 1), with n_layer configurable for benchmarks."""
    return Hparams(n_layer=n_layer, fast=FastHparams(n_layer=fast_n_layer, project_in=False))


# ---------------------------------------------------------------------- weights
def random_weight(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Values at scales that keep activations finite and logits non-degenerate at any dim.

    Norm gains ~ 1 +- 0.1; embedding tables std 4/sqrt(dim) (logits std ~4); projections
    std 1/sqrt(fan_in), halved for the ones that feed the residual stream (wo, w2).
    """
    rng = tensor_rng(seed, name)
    if is_norm(name):
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    fan_in = shape[-1]
    if "embeddings" in name:
        std = 4.0 / np.sqrt(fan_in)
    elif name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
        std = 0.5 / np.sqrt(fan_in)
    else:
        std = 1.0 / np.sqrt(fan_in)
    out = rng.standard_normal(shape, dtype=np.float32)
    out *= np.float32(std)
    return out


def more_bits_layer(i: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third
    layer in between."""
    return i < n_layer // 8 or i >= 7 * n_layer // 8 or (i - n_layer // 8) % 3 == 2


def _mixed_type(name: str, weight_type: str, n_layer: int) -> QT:
    base, more = MIXED_TYPES[weight_type]
    if name == "embeddings.weight":
        return more
    parts = name.split(".")
    if parts[0] == "layers" and name.endswith("feed_forward.w2.weight") \
            and more_bits_layer(int(parts[1]), n_layer):
        return more
    return base


def tensor_type(name: str, shape: tuple[int, ...], weight_type: str, n_layer: int = 1) -> QT:
    """The GGUF type a tensor gets in a file of `weight_type` (a model of n_layer layers: the
    mixed types give some layers more bits).

    Norms stay F32 (as in real files). A matrix whose rows are not whole blocks of the type
    falls back as llama.cpp's quantizer does: to Q8_0 if rows are whole 32-blocks, else F16.
    """
    if is_norm(name) or len(shape) == 1:
        return QT.F32
    qt = (_mixed_type(name, weight_type, n_layer) if weight_type in MIXED_TYPES
          else WEIGHT_TYPES[weight_type])
    block = gguf.GGML_QUANT_SIZES[qt][0]
    if shape[-1] % block == 0:
        return qt
    return QT.Q8_0 if shape[-1] % 32 == 0 else QT.F16


# ---------------------------------------------------------------------- writing
@dataclass(frozen=True)
class WrittenModel:
    path: Path
    hparams: Hparams
    weight_type: str
    tensor_types: dict[str, str]  # name -> GGUF type actually written


#: the scale fields of random quantized blocks (random_blocks=True): weights of order 1e-2
RANDOM_BLOCK_SCALE = 3e-5


def write_model(path: str | os.PathLike, hp: Hparams, weight_type: str = "f32", seed: int = 0,
                include_codec: bool = False, name: str = "s2core random test model",
                progress: Callable[[int, int], None] | None = None,
                random_blocks: bool = False,
                codec: CodecConfig | None = None) -> WrittenModel:
    """Write a GGUF file in s2.cpp's layout for hparams `hp` with random weights.

    `include_codec` adds a few `c.*` placeholder tensors and two `fish_speech.codec.*` keys,
    which the Slow-AR's readers must ignore. `codec` adds a whole codec instead (its `c.*`
    tensors in F16, or F32 in an f32 file, as s2.cpp's exporter writes them; see
    codec_writer). `progress(done, total)` is called per tensor.
    `random_blocks`: quantized tensors get random valid blocks instead of quantized random
    weights, for timing S2 Pro-sized files (the K-quant quantizer takes minutes a layer; a
    step's time does not depend on the values). Their numbers mean nothing else.
    """
    if weight_type not in WEIGHT_TYPES and weight_type not in MIXED_TYPES:
        raise ValueError(f"weight_type {weight_type!r} not in "
                         f"{sorted(WEIGHT_TYPES) + sorted(MIXED_TYPES)}")
    hp.validate()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")

    plan = [(n, s, tensor_type(n, s, weight_type, hp.n_layer))
            for n, s in expected_tensors(hp).items()]
    if include_codec:
        plan += [("c.encoder.conv.weight", (8, 16), QT.F16), ("c.quantizer.codebook", (32, 8), QT.F32)]
    codec_values = None
    if codec is not None:
        plan += codec_plan(codec, "f32" if weight_type == "f32" else "f16", prefix="c.")
        codec_values = codec_tensor_values(codec, seed)

    writer = gguf.GGUFWriter(tmp, arch=hp.architecture)
    _add_metadata(writer, hp, weight_type, name, include_codec)
    if codec is not None:
        add_codec_metadata(writer, codec)

    def stored(done: int, tname: str, shape: tuple[int, ...], qt: QT) -> np.ndarray:
        if codec_values is not None and tname.startswith("c."):
            return encode(codec_values(tname[2:], shape), qt)
        if random_blocks and qt in QUANTIZED_TYPES:
            values = gguf.GGML_QUANT_SIZES[qt][0]
            return _random_blocks(qt, shape[0], shape[1] // values, seed + done,
                                  RANDOM_BLOCK_SCALE)
        return encode(random_weight(tname, shape, seed), qt)

    write_tensors(writer, plan, stored, progress)
    writer.close()
    os.replace(tmp, path)  # a crash mid-write never leaves a half file under the real name
    return WrittenModel(path, hp, weight_type, {n: qt.name.lower() for n, _, qt in plan})


def _add_metadata(w: gguf.GGUFWriter, hp: Hparams, weight_type: str, name: str,
                  include_codec: bool) -> None:
    a, e = hp.architecture, EXT
    w.add_string("general.name", name)
    w.add_uint32("general.file_type", int(_FILE_TYPE[weight_type]))
    w.add_uint32(f"{a}.context_length", hp.context_length)
    w.add_uint32(f"{a}.embedding_length", hp.dim)
    w.add_uint32(f"{a}.feed_forward_length", hp.ffn)
    w.add_uint32(f"{a}.block_count", hp.n_layer)
    w.add_uint32(f"{a}.attention.head_count", hp.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", hp.n_head_kv)
    w.add_float32(f"{a}.rope.freq_base", hp.rope_freq_base)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", hp.rms_norm_eps)
    w.add_uint32(f"{a}.vocab_size", hp.vocab_size)
    w.add_string(f"{e}.model_type", "dual_ar")
    w.add_uint32(f"{e}.codebook_size", hp.codebook_size)
    w.add_uint32(f"{e}.num_codebooks", hp.num_codebooks)
    w.add_uint32(f"{e}.semantic_begin_id", hp.semantic_begin_id)
    w.add_uint32(f"{e}.semantic_end_id", hp.semantic_end_id)
    w.add_uint32(f"{e}.audio_pad_token_id", 0)
    w.add_bool(f"{e}.scale_codebook_embeddings", hp.scale_codebook_embeddings)
    w.add_bool(f"{e}.norm_fastlayer_input", True)
    w.add_bool(f"{e}.tie_word_embeddings", hp.tie_word_embeddings)
    w.add_bool(f"{e}.attention_qk_norm", hp.attention_qk_norm)
    f = hp.fast
    if f is not None and a == ARCH_DEFAULT:
        w.add_uint32(f"{e}.fast_context_length", f.context_length)
        w.add_uint32(f"{e}.fast_embedding_length", f.dim)
        w.add_uint32(f"{e}.fast_feed_forward_length", f.ffn)
        w.add_uint32(f"{e}.fast_block_count", f.n_layer)
        w.add_uint32(f"{e}.fast_head_count", f.n_head)
        w.add_uint32(f"{e}.fast_head_count_kv", f.n_head_kv)
        w.add_uint32(f"{e}.fast_head_dim", f.head_dim)
        w.add_float32(f"{e}.fast_rope_freq_base", f.rope_freq_base)
        w.add_float32(f"{e}.fast_layer_norm_rms_eps", f.rms_norm_eps)
        w.add_bool(f"{e}.fast_tie_word_embeddings", False)
        w.add_bool(f"{e}.fast_attention_qk_norm", f.attention_qk_norm)
        w.add_bool(f"{e}.fast_attention_qkv_bias", False)
        w.add_bool(f"{e}.fast_attention_o_bias", False)
        w.add_bool(f"{e}.fast_project_in", f.project_in)
    if include_codec:
        w.add_uint32(f"{e}.codec.sample_rate", 44100)
        w.add_uint32(f"{e}.codec.hop_length", 512)
