"""Write random-weight codecs in s2.cpp's exact GGUF layout (CODEC.md 1-3).

Used by the conformance kit, the tests, the benchmark and the demo (the real codec.pth cannot be
downloaded here). Two containers, as s2.cpp reads them: a codec-only file
(`general.architecture = "fish-speech-codec"`, names without prefix) and the codec inside a
full model file (`"fish-speech"`, names under `c.`; `write_model(..., codec=...)` adds the
Slow-AR and Fast-AR beside it). Every floating tensor is F16 or every one F32, as the exporter
writes them, in name-sorted order. Each tensor's values come from its own RNG stream seeded by
(seed, name), so the F16 and F32 files of one config hold the same weights up to rounding.

Weights are scaled so activations stay O(1) through every layer (convs 1/sqrt(fan in),
residual branches halved, layer scales 0.1, Snake alphas positive around 1) and the audio is
noise of a few tenths RMS, not saturated by the final tanh.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from s2core.codec.hparams import KEY_PREFIX, CodecHparams, TransformerHparams
from s2core.codec.layout import CodecLayout, Conv, ConvTranspose, build_layout
from s2core.embedded.encoding import Plan, encode, tensor_rng
from s2core.embedded.encoding import write_tensors as _write_stored

#: the container's architecture -> the prefix of codec tensor names (CODEC.md 1)
CODEC_ONLY_ARCH = "fish-speech-codec"
FULL_ARCH = "fish-speech"
WEIGHT_TYPES = {"f16": QT.F16, "f32": QT.F32}


@dataclass(frozen=True)
class CodecConfig:
    """A codec to write: its keys plus what the file's tensors decide (depths, FFN widths)."""

    hparams: CodecHparams
    #: layers of the pre_module and post_module transformers
    rvq_layers: int
    rvq_ffn: int
    #: FFN width of the encoder-block transformers as a multiple of their width (3 in S2 Pro)
    encoder_ffn_mult: int = 3
    #: written as rvq_transformer.n_head (s2.cpp ignores it; width / head_dim is what counts)
    rvq_n_head_key: int | None = None

    def layout(self) -> CodecLayout:
        hp = self.hparams

        def probe(prefix: str, width: int) -> tuple[int, int]:
            if prefix.startswith("quantizer."):
                return self.rvq_layers, self.rvq_ffn
            block = int(prefix.split(".")[2]) - 1  # encoder.block.{i+1}.block.5
            return hp.encoder_transformer_layers[block], self.encoder_ffn_mult * width

        return build_layout(hp, probe)

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(s)) for s in self.layout().tensors().values())


# ---------------------------------------------------------------------- configs
def codec_hparams(**values) -> CodecHparams:
    """CodecHparams from the keys' values, with the transformer keys flattened:
    enc_head_dim, enc_kv_heads, rvq_head_dim, rvq_kv_heads, rvq_rope_base, window."""
    enc_tf = TransformerHparams(head_dim=values.pop("enc_head_dim"),
                                n_local_heads=values.pop("enc_kv_heads", -1),
                                rope_freq_base=10000.0, rms_norm_eps=1e-5, window=512,
                                block_size=8192)
    rvq_tf = TransformerHparams(head_dim=values.pop("rvq_head_dim"),
                                n_local_heads=values.pop("rvq_kv_heads", -1),
                                rope_freq_base=values.pop("rvq_rope_base", 10000.0),
                                rms_norm_eps=1e-5, window=values.pop("window"), block_size=2048)
    latent = values["latent_dim"]
    hp = CodecHparams(quantizer_input_dim=latent, encoder_transformer=enc_tf,
                      rvq_transformer=rvq_tf, rvq_dim=latent, **values)
    hp.validate()
    return hp


def s2pro_codec_config() -> CodecConfig:
    """S2 Pro's real codec structure (CODEC.md 2-3): 391,398,385 parameters, ~0.78 GB in F16."""
    hp = codec_hparams(sample_rate=44100, hop_length=512, frame_length=512, encoder_dim=64,
                  decoder_dim=1536, latent_dim=1024, encoder_rates=(2, 4, 8, 8),
                  decoder_rates=(8, 8, 4, 2), encoder_transformer_layers=(0, 0, 0, 4),
                  codebook_dim=8, residual_codebooks=9, residual_codebook_size=1024,
                  semantic_codebook_size=4096, downsample_factor=(2, 2), enc_head_dim=64,
                  rvq_head_dim=64, window=128, rvq_n_layer=8)
    return CodecConfig(hp, rvq_layers=8, rvq_ffn=3072, rvq_n_head_key=16)


def tiny_codec_config(**overrides) -> CodecConfig:
    """The shared conformance example's shape (32 samples a frame, window 4, 10 codebooks of
    64 / 16 entries); keyword arguments replace hparams fields."""
    hp = codec_hparams(sample_rate=44100, hop_length=8, frame_length=8, encoder_dim=16, decoder_dim=64,
                  latent_dim=32, encoder_rates=(2, 4), decoder_rates=(4, 2),
                  encoder_transformer_layers=(0, 1), codebook_dim=4, residual_codebooks=9,
                  residual_codebook_size=16, semantic_codebook_size=64, downsample_factor=(2, 2),
                  enc_head_dim=64, rvq_head_dim=8, window=4, rvq_n_layer=2)
    return CodecConfig(replace(hp, **overrides), rvq_layers=2, rvq_ffn=64)


def demo_codec_config() -> CodecConfig:
    """The embedded demo's codec: the demo model's 10 codebooks of 1024 codes (semantic
    included), S2 Pro's rates and structure at a width that decodes faster than real time."""
    hp = codec_hparams(sample_rate=44100, hop_length=512, frame_length=512, encoder_dim=8,
                  decoder_dim=128, latent_dim=128, encoder_rates=(2, 4, 8, 8),
                  decoder_rates=(8, 8, 4, 2), encoder_transformer_layers=(0, 0, 0, 1),
                  codebook_dim=8, residual_codebooks=9, residual_codebook_size=1024,
                  semantic_codebook_size=1024, downsample_factor=(2, 2), enc_head_dim=32,
                  rvq_head_dim=32, window=32, rvq_n_layer=2)
    return CodecConfig(hp, rvq_layers=2, rvq_ffn=256)


# ---------------------------------------------------------------------- weights
def _scales(layout: CodecLayout) -> dict[str, float]:
    """Standard deviation of each conv weight: 1/sqrt(fan in), halved in residual branches."""
    out: dict[str, float] = {}

    def conv(c: Conv, gain: float = 1.0) -> None:
        fan_in = (1 if c.depthwise else c.c_in) * c.kernel
        out[c.weight] = gain / np.sqrt(fan_in)

    def conv_t(c: ConvTranspose) -> None:
        out[c.weight] = 1.0 / np.sqrt(c.c_in * c.kernel / c.stride)  # inputs per output

    enc, q, dec = layout.encoder, layout.quantizer, layout.decoder
    convs = [enc.conv_in, enc.conv_out, dec.conv_in]
    units = [u for b in enc.blocks for u in b.units] + [u for b in dec.blocks for u in b.units]
    for u in units:
        conv(u.conv1)
        conv(u.conv2, 0.3)
    for b in enc.blocks:
        convs.append(b.conv)
    for c, cnx in q.downsample:
        convs += [c, cnx.dwconv]
    for c, cnx in q.upsample:
        conv_t(c)
        convs.append(cnx.dwconv)
    for b in dec.blocks:
        conv_t(b.upsample)
    for vq in q.codebooks:
        convs += [vq.in_proj, vq.out_proj]
    for c in convs:
        conv(c)
    conv(dec.conv_out, 0.15)
    return out


def random_codec_weight(name: str, shape: tuple[int, ...], seed: int,
                        conv_scales: dict[str, float]) -> np.ndarray:
    """float32 values for the tensor `name` (without prefix)."""
    rng = tensor_rng(seed, name)
    normal = rng.standard_normal(shape, dtype=np.float32)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "alpha":  # Snake divides by alpha: keep it away from 0
        return np.exp(0.2 * normal).astype(np.float32)
    if name.endswith(("norm.weight",)):
        return (1.0 + 0.1 * normal).astype(np.float32)
    if leaf == "gamma":  # layer scales of the transformer and ConvNeXt branches
        return (0.1 * (1.0 + 0.1 * normal)).astype(np.float32)
    if leaf == "bias":
        return (0.02 * normal).astype(np.float32)
    if name.endswith("codebook.weight"):
        return normal
    if name in conv_scales:
        return (normal * np.float32(conv_scales[name])).astype(np.float32)
    # transformer and ConvNeXt linears, [out, in]; the branch outputs (wo, w2, pwconv2) halved
    gain = 0.5 if name.endswith(("wo.weight", "w2.weight", "pwconv2.weight")) else 1.0
    return (normal * np.float32(gain / np.sqrt(shape[-1]))).astype(np.float32)


# ---------------------------------------------------------------------- writing
def codec_plan(config: CodecConfig, weight_type: str = "f16", prefix: str = ""
               ) -> list[tuple[str, tuple[int, ...], QT]]:
    """(full name, shape, type) of every codec tensor, name-sorted as the exporter writes."""
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"codec weight_type {weight_type!r} not in {sorted(WEIGHT_TYPES)}")
    qt = WEIGHT_TYPES[weight_type]
    return sorted((prefix + n, s, qt) for n, s in config.layout().tensors().items())


def codec_tensor_values(config: CodecConfig, seed: int) -> Callable[[str, tuple[int, ...]], np.ndarray]:
    """name (without prefix), shape -> float32 values of that tensor."""
    scales = _scales(config.layout())
    return lambda name, shape: random_codec_weight(name, shape, seed, scales)


def add_codec_metadata(w: gguf.GGUFWriter, config: CodecConfig) -> None:
    """Every `fish_speech.codec.*` key with the exporter's types (u32, i32 arrays, f32)."""
    hp, k = config.hparams, KEY_PREFIX
    for key, value in (("sample_rate", hp.sample_rate), ("hop_length", hp.hop_length),
                       ("frame_length", hp.frame_length), ("encoder_dim", hp.encoder_dim),
                       ("decoder_dim", hp.decoder_dim), ("latent_dim", hp.latent_dim),
                       ("quantizer_input_dim", hp.quantizer_input_dim),
                       ("quantizer_codebook_dim", hp.codebook_dim),
                       ("quantizer_residual_codebooks", hp.residual_codebooks),
                       ("quantizer_residual_codebook_size", hp.residual_codebook_size),
                       ("quantizer_semantic_codebook_size", hp.semantic_codebook_size)):
        w.add_uint32(k + key, value)
    for key, values in (("encoder_rates", hp.encoder_rates), ("decoder_rates", hp.decoder_rates),
                        ("encoder_transformer_layers", hp.encoder_transformer_layers),
                        ("decoder_transformer_layers", (0,) * len(hp.decoder_rates)),
                        ("quantizer_downsample_factor", hp.downsample_factor)):
        w.add_array(k + key, [int(v) for v in values])
    w.add_string(k + "quantizer_type", "downsample_residual_vector_quantize")
    for name, t in (("transformer.", hp.encoder_transformer), ("rvq_transformer.", hp.rvq_transformer)):
        w.add_uint32(k + name + "block_size", t.block_size)
        w.add_int32(k + name + "n_local_heads", t.n_local_heads)
        w.add_uint32(k + name + "head_dim", t.head_dim)
        w.add_float32(k + name + "rope_freq_base", t.rope_freq_base)
        w.add_float32(k + name + "layer_norm_rms_eps", t.rms_norm_eps)
    r = k + "rvq_transformer."
    w.add_uint32(r + "window_size", hp.rvq_transformer.window)
    w.add_uint32(r + "n_layer", hp.rvq_n_layer)
    w.add_uint32(r + "n_head", config.rvq_n_head_key or hp.rvq_transformer.n_head(hp.rvq_dim))
    w.add_uint32(r + "dim", hp.rvq_dim)
    w.add_uint32(r + "feed_forward_length", config.rvq_ffn)


@dataclass(frozen=True)
class WrittenCodec:
    path: Path
    config: CodecConfig
    weight_type: str
    prefix: str


def write_codec(path: str | os.PathLike, config: CodecConfig, weight_type: str = "f16",
                seed: int = 0, codec_only: bool = True, name: str = "s2core random codec",
                progress: Callable[[int, int], None] | None = None) -> WrittenCodec:
    """Write the codec alone: codec_only=True gives a `fish-speech-codec` file (no prefix),
    False a `fish-speech` file holding only the `c.` tensors (as the shared example)."""
    prefix = "" if codec_only else "c."
    plan = codec_plan(config, weight_type, prefix)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    writer = gguf.GGUFWriter(tmp, arch=CODEC_ONLY_ARCH if codec_only else FULL_ARCH)
    writer.add_string("general.name", name)
    writer.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_F16 if weight_type == "f16"
                                               else gguf.LlamaFileType.ALL_F32))
    add_codec_metadata(writer, config)
    write_tensors(writer, plan, codec_tensor_values(config, seed), prefix, progress)
    writer.close()
    os.replace(tmp, path)  # never a half-written file under the real name
    return WrittenCodec(path, config, weight_type, prefix)


def write_tensors(writer: gguf.GGUFWriter, plan: Plan,
                  values: Callable[[str, tuple[int, ...]], np.ndarray], strip: str = "",
                  progress: Callable[[int, int], None] | None = None) -> None:
    """Write the plan's tensors from float32 `values(name, shape)`, each encoded to its type;
    `strip` is removed from names for `values`."""
    def stored(_done: int, name: str, shape: tuple[int, ...], qt: QT) -> np.ndarray:
        return encode(values(name[len(strip):] if strip and name.startswith(strip) else name,
                             shape), qt)

    _write_stored(writer, plan, stored, progress)


#: bump when the writer's output for the same arguments changes
CODEC_WRITER_VERSION = 1
