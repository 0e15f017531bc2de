"""The codec's structure (CODEC.md 3): every module with its tensor names and shapes.

One description shared by the file check (every tensor the path uses), the writer of random
codecs, and the backends, which walk it to load their weights and to run the decode and encode
paths in order. Names are without the `c.` prefix. Transformer depths are found as s2.cpp finds
them, by probing `layers.k.attention.wqkv.weight` for k = 0, 1, ... (`build_layout`'s probe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from s2core.codec.hparams import CodecHparams, TransformerHparams

Shape = tuple[int, ...]
#: the dilations of the three residual units of every encoder and decoder block
RESIDUAL_DILATIONS = (1, 3, 9)
#: kernel of the residual units' dilated convs, the first/last convs and ConvNeXt's dwconv
KERNEL = 7


@dataclass(frozen=True)
class Conv:
    """A causal Conv1d (CODEC.md 4): weight [c_out, c_in (1 if depthwise), kernel], bias."""

    name: str
    c_out: int
    c_in: int
    kernel: int
    stride: int = 1
    dilation: int = 1
    depthwise: bool = False

    @property
    def weight(self) -> str:
        return f"{self.name}.weight"

    @property
    def bias(self) -> str:
        return f"{self.name}.bias"

    @property
    def history(self) -> int:
        """Past input steps a stride-1 output needs: (kernel - 1) * dilation (the left pad)."""
        return (self.kernel - 1) * self.dilation

    def tensors(self) -> dict[str, Shape]:
        return {self.weight: (self.c_out, 1 if self.depthwise else self.c_in, self.kernel),
                self.bias: (self.c_out,)}


@dataclass(frozen=True)
class ConvTranspose:
    """ConvTranspose1d with weight [c_in, c_out, kernel]. The decoder's have kernel = 2 stride
    and drop the last `stride` outputs (output block t reads inputs t and t-1); the quantizer's
    upsampling has kernel = stride (no overlap)."""

    name: str
    c_in: int
    c_out: int
    kernel: int
    stride: int

    @property
    def weight(self) -> str:
        return f"{self.name}.weight"

    @property
    def bias(self) -> str:
        return f"{self.name}.bias"

    @property
    def overlap(self) -> bool:
        """True for kernel 2 * stride (needs the previous input), False for kernel = stride."""
        return self.kernel != self.stride

    def tensors(self) -> dict[str, Shape]:
        return {self.weight: (self.c_in, self.c_out, self.kernel), self.bias: (self.c_out,)}


@dataclass(frozen=True)
class Snake:
    """y = x + sin(alpha x)^2 / alpha, alpha [1, width, 1] per channel."""

    alpha: str
    width: int

    def tensors(self) -> dict[str, Shape]:
        return {self.alpha: (1, self.width, 1)}


@dataclass(frozen=True)
class ResidualUnit:
    """x + conv1x1(Snake(conv_k7_dilated(Snake(x))))."""

    snake1: Snake
    conv1: Conv
    snake2: Snake
    conv2: Conv

    @classmethod
    def at(cls, prefix: str, width: int, dilation: int) -> "ResidualUnit":
        return cls(Snake(f"{prefix}.block.0.alpha", width),
                   Conv(f"{prefix}.block.1.conv", width, width, KERNEL, dilation=dilation),
                   Snake(f"{prefix}.block.2.alpha", width),
                   Conv(f"{prefix}.block.3.conv", width, width, 1))

    def tensors(self) -> dict[str, Shape]:
        return {**self.snake1.tensors(), **self.conv1.tensors(), **self.snake2.tensors(),
                **self.conv2.tensors()}


@dataclass(frozen=True)
class ConvNeXt:
    """x + gamma * pwconv2(GELU(pwconv1(LayerNorm(dwconv(x))))), per time step after dwconv."""

    prefix: str
    dim: int

    @property
    def dwconv(self) -> Conv:
        return Conv(f"{self.prefix}.dwconv.conv", self.dim, self.dim, KERNEL, depthwise=True)

    def name(self, part: str) -> str:
        """norm.weight, norm.bias, pwconv1.weight, pwconv1.bias, pwconv2.*, gamma."""
        return f"{self.prefix}.{part}"

    def tensors(self) -> dict[str, Shape]:
        d = self.dim
        return {**self.dwconv.tensors(), self.name("norm.weight"): (d,),
                self.name("norm.bias"): (d,), self.name("pwconv1.weight"): (4 * d, d),
                self.name("pwconv1.bias"): (4 * d,), self.name("pwconv2.weight"): (d, 4 * d),
                self.name("pwconv2.bias"): (d,), self.name("gamma"): (d,)}


#: a transformer layer's tensors: attribute -> name below `layers.k`
LAYER_TENSORS = {
    "attention_norm": "attention_norm.weight", "wqkv": "attention.wqkv.weight",
    "wo": "attention.wo.weight", "attention_scale": "attention_layer_scale.gamma",
    "ffn_norm": "ffn_norm.weight", "w1": "feed_forward.w1.weight",
    "w3": "feed_forward.w3.weight", "w2": "feed_forward.w2.weight",
    "ffn_scale": "ffn_layer_scale.gamma",
}


@dataclass(frozen=True)
class Transformer:
    """Pre-norm layers with layer-scaled attention and SwiGLU branches, then a final RMSNorm;
    causal attention over `window` positions with adjacent-pair RoPE; no biases (CODEC.md 4)."""

    prefix: str
    width: int
    n_layers: int
    ffn: int
    n_head: int
    n_kv_head: int
    head_dim: int
    rope_base: float
    eps: float
    #: 0 = plain causal attention
    window: int

    @property
    def norm(self) -> str:
        return f"{self.prefix}.norm.weight"

    def layer(self, k: int) -> dict[str, str]:
        """Layer k's tensor names by attribute (see LAYER_TENSORS)."""
        return {attr: f"{self.prefix}.layers.{k}.{name}" for attr, name in LAYER_TENSORS.items()}

    def tensors(self) -> dict[str, Shape]:
        w, f, hd = self.width, self.ffn, self.head_dim
        shapes = {"attention_norm": (w,), "wqkv": ((self.n_head + 2 * self.n_kv_head) * hd, w),
                  "wo": (w, self.n_head * hd), "attention_scale": (w,), "ffn_norm": (w,),
                  "w1": (f, w), "w3": (f, w), "w2": (w, f), "ffn_scale": (w,)}
        out: dict[str, Shape] = {}
        for k in range(self.n_layers):
            out.update((name, shapes[attr]) for attr, name in self.layer(k).items())
        out[self.norm] = (w,)
        return out


@dataclass(frozen=True)
class VectorQuantizer:
    """One codebook: in_proj (encode only) D -> codebook_dim, codebook, out_proj back to D."""

    prefix: str
    size: int
    dim: int
    codebook_dim: int

    @property
    def in_proj(self) -> Conv:
        return Conv(f"{self.prefix}.in_proj", self.codebook_dim, self.dim, 1)

    @property
    def out_proj(self) -> Conv:
        return Conv(f"{self.prefix}.out_proj", self.dim, self.codebook_dim, 1)

    @property
    def codebook(self) -> str:
        return f"{self.prefix}.codebook.weight"

    def decode_tensors(self) -> dict[str, Shape]:
        return {**self.out_proj.tensors(), self.codebook: (self.size, self.codebook_dim)}

    def tensors(self) -> dict[str, Shape]:
        return {**self.in_proj.tensors(), **self.decode_tensors()}


@dataclass(frozen=True)
class DecoderBlock:
    snake: Snake
    upsample: ConvTranspose
    units: tuple[ResidualUnit, ...]

    def tensors(self) -> dict[str, Shape]:
        out = {**self.snake.tensors(), **self.upsample.tensors()}
        for u in self.units:
            out.update(u.tensors())
        return out


@dataclass(frozen=True)
class Decoder:
    """Latent [D, L] -> audio: conv k7, blocks (Snake, ConvTranspose, 3 RUs), Snake, conv, tanh."""

    conv_in: Conv
    blocks: tuple[DecoderBlock, ...]
    snake_out: Snake
    conv_out: Conv

    def tensors(self) -> dict[str, Shape]:
        out = dict(self.conv_in.tensors())
        for b in self.blocks:
            out.update(b.tensors())
        return {**out, **self.snake_out.tensors(), **self.conv_out.tensors()}


@dataclass(frozen=True)
class EncoderBlock:
    units: tuple[ResidualUnit, ...]
    snake: Snake
    conv: Conv  # stride r_i
    transformer: Transformer | None

    def tensors(self) -> dict[str, Shape]:
        out: dict[str, Shape] = {}
        for u in self.units:
            out.update(u.tensors())
        out.update(self.snake.tensors())
        out.update(self.conv.tensors())
        if self.transformer is not None:
            out.update(self.transformer.tensors())
        return out


@dataclass(frozen=True)
class Encoder:
    """Audio [1, N] -> latent [D, N / hop]: conv k7, blocks, Snake, conv k3."""

    conv_in: Conv
    blocks: tuple[EncoderBlock, ...]
    snake_out: Snake
    conv_out: Conv

    def tensors(self) -> dict[str, Shape]:
        out = dict(self.conv_in.tensors())
        for b in self.blocks:
            out.update(b.tensors())
        return {**out, **self.snake_out.tensors(), **self.conv_out.tensors()}


@dataclass(frozen=True)
class Quantizer:
    semantic: VectorQuantizer
    residual: tuple[VectorQuantizer, ...]
    downsample: tuple[tuple[Conv, ConvNeXt], ...]     # encode only
    pre_module: Transformer                             # encode only
    post_module: Transformer
    upsample: tuple[tuple[ConvTranspose, ConvNeXt], ...]

    @property
    def codebooks(self) -> tuple[VectorQuantizer, ...]:
        """Semantic first, then the residual ones: the order of the codes' rows."""
        return (self.semantic,) + self.residual

    def decode_tensors(self) -> dict[str, Shape]:
        out: dict[str, Shape] = {}
        for vq in self.codebooks:
            out.update(vq.decode_tensors())
        out.update(self.post_module.tensors())
        for conv, cnx in self.upsample:
            out.update(conv.tensors())
            out.update(cnx.tensors())
        return out

    def encode_tensors(self) -> dict[str, Shape]:
        out: dict[str, Shape] = {}
        for vq in self.codebooks:
            out.update(vq.tensors())
        for conv, cnx in self.downsample:
            out.update(conv.tensors())
            out.update(cnx.tensors())
        out.update(self.pre_module.tensors())
        return out


@dataclass(frozen=True)
class CodecLayout:
    hparams: CodecHparams
    encoder: Encoder
    quantizer: Quantizer
    decoder: Decoder

    def decode_tensors(self) -> dict[str, Shape]:
        """Every tensor codes -> audio reads (CODEC.md 4)."""
        return {**self.quantizer.decode_tensors(), **self.decoder.tensors()}

    def encode_tensors(self) -> dict[str, Shape]:
        """Every tensor audio -> codes reads (CODEC.md 5)."""
        return {**self.encoder.tensors(), **self.quantizer.encode_tensors()}

    def tensors(self) -> dict[str, Shape]:
        return {**self.encode_tensors(), **self.decode_tensors()}

    def transformers(self) -> Iterator[Transformer]:
        for b in self.encoder.blocks:
            if b.transformer is not None:
                yield b.transformer
        yield self.quantizer.pre_module
        yield self.quantizer.post_module


#: (prefix, width) -> (layer count, feed-forward width) of the transformer at `prefix`
TransformerProbe = Callable[[str, int], "tuple[int, int]"]


def build_layout(hp: CodecHparams, probe: TransformerProbe) -> CodecLayout:
    """The structure for these hparams; `probe` tells each transformer's depth and FFN width
    (from a file: by probing tensor names and shapes; from a writer: by its config)."""

    def transformer(prefix: str, width: int, t: TransformerHparams) -> Transformer:
        n_layers, ffn = probe(prefix, width)
        return Transformer(prefix, width, n_layers, ffn, t.n_head(width), t.n_kv_head(width),
                           t.head_dim, t.rope_freq_base, t.rms_norm_eps, t.window)

    def units(prefix: str, width: int, first: int) -> tuple[ResidualUnit, ...]:
        return tuple(ResidualUnit.at(f"{prefix}.block.{first + j}", width, d)
                     for j, d in enumerate(RESIDUAL_DILATIONS))

    d = hp.latent_dim
    n = len(hp.encoder_rates)
    blocks = []
    for i, rate in enumerate(hp.encoder_rates):
        p, w = f"encoder.block.{i + 1}", hp.encoder_width(i)
        tf = (transformer(f"{p}.block.5", w, hp.encoder_transformer)
              if hp.encoder_transformer_layers[i] > 0 else None)
        blocks.append(EncoderBlock(units(p, w // 2, 0), Snake(f"{p}.block.3.alpha", w // 2),
                                   Conv(f"{p}.block.4.conv", w, w // 2, 2 * rate, stride=rate), tf))
    w_last = hp.encoder_width(n - 1)
    encoder = Encoder(Conv("encoder.block.0.conv", hp.encoder_dim, 1, KERNEL), tuple(blocks),
                      Snake(f"encoder.block.{n + 1}.alpha", w_last),
                      Conv(f"encoder.block.{n + 2}.conv", d, w_last, 3))

    rvq = hp.rvq_transformer
    factors = hp.downsample_factor
    quantizer = Quantizer(
        semantic=VectorQuantizer("quantizer.semantic_quantizer.quantizers.0",
                                 hp.semantic_codebook_size, d, hp.codebook_dim),
        residual=tuple(VectorQuantizer(f"quantizer.quantizer.quantizers.{q}",
                                       hp.residual_codebook_size, d, hp.codebook_dim)
                       for q in range(hp.residual_codebooks)),
        downsample=tuple((Conv(f"quantizer.downsample.{j}.0.conv", d, d, f, stride=f),
                          ConvNeXt(f"quantizer.downsample.{j}.1", d))
                         for j, f in enumerate(factors)),
        pre_module=transformer("quantizer.pre_module", d, rvq),
        post_module=transformer("quantizer.post_module", d, rvq),
        upsample=tuple((ConvTranspose(f"quantizer.upsample.{u}.0.conv", d, d, f, f),
                        ConvNeXt(f"quantizer.upsample.{u}.1", d))
                       for u, f in enumerate(reversed(factors))))

    m = len(hp.decoder_rates)
    dec_blocks = []
    for i, s in enumerate(hp.decoder_rates):
        p, c_in, c_out = f"decoder.model.{i + 1}", hp.decoder_width(i), hp.decoder_width(i + 1)
        dec_blocks.append(DecoderBlock(Snake(f"{p}.block.0.alpha", c_in),
                                       ConvTranspose(f"{p}.block.1.conv", c_in, c_out, 2 * s, s),
                                       units(p, c_out, 2)))
    c_last = hp.decoder_width(m)
    decoder = Decoder(Conv("decoder.model.0.conv", hp.decoder_dim, d, KERNEL), tuple(dec_blocks),
                      Snake(f"decoder.model.{m + 1}.alpha", c_last),
                      Conv(f"decoder.model.{m + 2}.conv", 1, c_last, KERNEL))
    return CodecLayout(hp, encoder, quantizer, decoder)
