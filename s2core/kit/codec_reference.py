"""A float64 reference of the codec, written straight from CODEC.md 4 and 5.

Plain NumPy in float64, one operation per function, shaped for reading rather than speed (it
runs on the kit's tiny codecs). It shares no code with any backend, nor the core's layout: it
spells every tensor name itself, from CODEC.md 3, and only reads values and keys through the
file. Activations are channels-first `x[C, L]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from s2core.codec.file import CodecFile

ENCODER_WINDOW = 512
_erf = np.vectorize(math.erf, otypes=[np.float64])


# ---------------------------------------------------------------------- operations
def causal_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int = 1,
                dilation: int = 1, groups: int = 1) -> np.ndarray:
    """CODEC.md 4 "Causal conv": pad left Ke - s, pad right `extra`, valid conv, + bias."""
    c_out, c_in_g, k = w.shape
    length = x.shape[1]
    ke = (k - 1) * dilation + 1
    left = ke - stride
    extra = (math.ceil((length - ke + (ke - stride)) / stride + 1) - 1) * stride + stride - length
    xp = np.concatenate([np.zeros((x.shape[0], left)), x, np.zeros((x.shape[0], extra))], axis=1)
    n_out = (xp.shape[1] - ke) // stride + 1
    out = np.zeros((c_out, n_out))
    per_group = c_out // groups
    for g in range(groups):
        xs = xp[g * c_in_g:(g + 1) * c_in_g]
        rows = slice(g * per_group, (g + 1) * per_group)
        for tap in range(k):
            start = tap * dilation
            cols = xs[:, start:start + (n_out - 1) * stride + 1:stride]
            out[rows] += w[rows, :, tap] @ cols
    return out + b[:, None]


def conv_transpose(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """ConvTranspose1d, weight [C_in, C_out, K], full output length (L - 1) stride + K."""
    _, c_out, k = w.shape
    length = x.shape[1]
    out = np.zeros((c_out, (length - 1) * stride + k))
    for t in range(length):  # input step t spreads over outputs [t stride, t stride + K)
        out[:, t * stride:t * stride + k] += np.tensordot(x[:, t], w, axes=(0, 0))
    return out + b[:, None]


def snake(x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    a = alpha.reshape(-1, 1)
    return x + np.sin(a * x) ** 2 / a


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x [T, w] -> x / sqrt(mean(x^2) + eps) * weight."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def rope(x: np.ndarray, base: float) -> np.ndarray:
    """x [T, heads, hd]: rotate adjacent pairs (2i, 2i+1) by pos * base^(-2i/hd), pos = 0.."""
    t, _, hd = x.shape
    pos = np.arange(t, dtype=np.float64)[:, None]
    theta = pos * base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)  # [T, hd/2]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


# ---------------------------------------------------------------------- the reference
@dataclass(frozen=True)
class EncodeReference:
    codes: np.ndarray    # [num_codebooks, T] int64
    #: best cosine minus the runner-up's, per decision: small values are near-ties, where a
    #: float32 implementation may rightly pick the other code (and every later codebook of
    #: that frame then differs too)
    margins: np.ndarray  # [num_codebooks, T]
    latent: np.ndarray   # [D, T] after pre_module


class CodecReference:
    """decode(codes) and encode(audio) of one codec file, in float64."""

    def __init__(self, codec_file: CodecFile):
        self.file = codec_file
        self.hp = codec_file.hparams

    def w(self, name: str) -> np.ndarray:
        return self.file.tensor(name, np.float64)

    def _conv(self, prefix: str, x: np.ndarray, stride: int = 1, dilation: int = 1,
              groups: int = 1) -> np.ndarray:
        return causal_conv(x, self.w(f"{prefix}.weight"), self.w(f"{prefix}.bias"),
                           stride, dilation, groups)

    def _snake(self, name: str, x: np.ndarray) -> np.ndarray:
        return snake(x, self.w(name).reshape(-1))

    def _residual_unit(self, p: str, x: np.ndarray, dilation: int) -> np.ndarray:
        y = self._snake(f"{p}.block.0.alpha", x)
        y = self._conv(f"{p}.block.1.conv", y, dilation=dilation)
        y = self._snake(f"{p}.block.2.alpha", y)
        y = self._conv(f"{p}.block.3.conv", y)
        return x + y

    def _convnext(self, p: str, x: np.ndarray) -> np.ndarray:
        y = self._conv(f"{p}.dwconv.conv", x, groups=x.shape[0]).T  # [L, D]
        y = layer_norm(y, self.w(f"{p}.norm.weight"), self.w(f"{p}.norm.bias"))
        y = gelu(y @ self.w(f"{p}.pwconv1.weight").T + self.w(f"{p}.pwconv1.bias"))
        y = y @ self.w(f"{p}.pwconv2.weight").T + self.w(f"{p}.pwconv2.bias")
        return x + (y * self.w(f"{p}.gamma")).T

    def _transformer(self, p: str, x: np.ndarray, head_dim: int, n_local_heads: int,
                     base: float, eps: float, window: int) -> np.ndarray:
        """x [D, T] channels-first in and out; computed token-major."""
        h_x = x.T.copy()
        t_len, width = h_x.shape
        n_head = width // head_dim
        n_kv = n_local_heads if n_local_heads >= 1 else n_head
        tq = np.arange(t_len)[:, None]
        tk = np.arange(t_len)[None, :]
        allowed = tk <= tq
        if 0 < window < t_len:
            allowed &= tk >= tq - window + 1
        k = 0
        while f"{p}.layers.{k}.attention.wqkv.weight" in self.file:
            lp = f"{p}.layers.{k}"
            h = rms_norm(h_x, self.w(f"{lp}.attention_norm.weight"), eps)
            qkv = h @ self.w(f"{lp}.attention.wqkv.weight").T
            q = qkv[:, :n_head * head_dim].reshape(t_len, n_head, head_dim)
            kk = qkv[:, n_head * head_dim:(n_head + n_kv) * head_dim].reshape(t_len, n_kv, head_dim)
            v = qkv[:, (n_head + n_kv) * head_dim:].reshape(t_len, n_kv, head_dim)
            q, kk = rope(q, base), rope(kk, base)
            rep = n_head // n_kv
            kk, v = np.repeat(kk, rep, axis=1), np.repeat(v, rep, axis=1)  # repeat_interleave
            scores = np.einsum("qhd,khd->hqk", q, kk) / math.sqrt(head_dim)
            scores = np.where(allowed[None], scores, -np.inf)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            attn = np.einsum("hqk,khd->qhd", probs, v).reshape(t_len, n_head * head_dim)
            attn = attn @ self.w(f"{lp}.attention.wo.weight").T
            h_x = h_x + self.w(f"{lp}.attention_layer_scale.gamma") * attn
            h = rms_norm(h_x, self.w(f"{lp}.ffn_norm.weight"), eps)
            ffn = (silu(h @ self.w(f"{lp}.feed_forward.w1.weight").T)
                   * (h @ self.w(f"{lp}.feed_forward.w3.weight").T))
            h_x = h_x + self.w(f"{lp}.ffn_layer_scale.gamma") * (ffn @ self.w(f"{lp}.feed_forward.w2.weight").T)
            k += 1
        return rms_norm(h_x, self.w(f"{p}.norm.weight"), eps).T

    def _rvq_transformer(self, p: str, x: np.ndarray) -> np.ndarray:
        t = self.hp.rvq_transformer
        return self._transformer(p, x, t.head_dim, t.n_local_heads, t.rope_freq_base,
                                 t.rms_norm_eps, t.window)

    def _vq_prefixes(self) -> list[tuple[str, int]]:
        hp = self.hp
        return ([("quantizer.semantic_quantizer.quantizers.0", hp.semantic_codebook_size)]
                + [(f"quantizer.quantizer.quantizers.{q}", hp.residual_codebook_size)
                   for q in range(hp.residual_codebooks)])

    # ------------------------------------------------------------------ decode (CODEC.md 4)
    def latent(self, codes: np.ndarray) -> np.ndarray:
        """Steps 1-4: clamp, RVQ decode, post_module, upsample -> [D, T prod(f)]."""
        codes = np.asarray(codes, dtype=np.int64)
        z = 0.0
        for cb, (p, size) in enumerate(self._vq_prefixes()):
            idx = np.clip(codes[cb], 0, size - 1)
            vectors = self.w(f"{p}.codebook.weight")[idx].T           # [cbd, T]
            z = z + self.w(f"{p}.out_proj.weight")[:, :, 0] @ vectors + self.w(f"{p}.out_proj.bias")[:, None]
        z = self._rvq_transformer("quantizer.post_module", z)
        factors = list(self.hp.downsample_factor)
        for u, f in enumerate(reversed(factors)):
            p = f"quantizer.upsample.{u}"
            z = conv_transpose(z, self.w(f"{p}.0.conv.weight"), self.w(f"{p}.0.conv.bias"), f)
            z = self._convnext(f"{p}.1", z)
        return z

    def decode(self, codes: np.ndarray) -> np.ndarray:
        x = self._conv("decoder.model.0.conv", self.latent(codes))
        for i, s in enumerate(self.hp.decoder_rates):
            p = f"decoder.model.{i + 1}"
            x = self._snake(f"{p}.block.0.alpha", x)
            full = conv_transpose(x, self.w(f"{p}.block.1.conv.weight"),
                                  self.w(f"{p}.block.1.conv.bias"), s)
            x = full[:, :full.shape[1] - s]  # drop the last s samples
            for j, d in enumerate((1, 3, 9)):
                x = self._residual_unit(f"{p}.block.{j + 2}", x, d)
        m = len(self.hp.decoder_rates)
        x = self._snake(f"decoder.model.{m + 1}.alpha", x)
        x = self._conv(f"decoder.model.{m + 2}.conv", x)
        return np.tanh(x[0])

    # ------------------------------------------------------------------ encode (CODEC.md 5)
    def encoder_latent(self, audio: np.ndarray) -> np.ndarray:
        """Steps 1-3: pad, encoder, downsample, pre_module -> [D, T]."""
        hp = self.hp
        audio = np.asarray(audio, dtype=np.float64)
        pad = -len(audio) % hp.frame_length
        x = np.concatenate([audio, np.zeros(pad)])[None, :]
        x = self._conv("encoder.block.0.conv", x)
        et = hp.encoder_transformer
        for i, r in enumerate(hp.encoder_rates):
            p = f"encoder.block.{i + 1}"
            for j, d in enumerate((1, 3, 9)):
                x = self._residual_unit(f"{p}.block.{j}", x, d)
            x = self._snake(f"{p}.block.3.alpha", x)
            x = self._conv(f"{p}.block.4.conv", x, stride=r)
            if hp.encoder_transformer_layers[i] > 0:
                x = self._transformer(f"{p}.block.5", x, et.head_dim, et.n_local_heads,
                                      et.rope_freq_base, et.rms_norm_eps, ENCODER_WINDOW)
        n = len(hp.encoder_rates)
        x = self._snake(f"encoder.block.{n + 1}.alpha", x)
        x = self._conv(f"encoder.block.{n + 2}.conv", x)
        for j, f in enumerate(hp.downsample_factor):
            x = self._conv(f"quantizer.downsample.{j}.0.conv", x, stride=f)
            x = self._convnext(f"quantizer.downsample.{j}.1", x)
        return self._rvq_transformer("quantizer.pre_module", x)

    def encode(self, audio: np.ndarray) -> EncodeReference:
        z = self.encoder_latent(audio)
        t_len = z.shape[1]
        prefixes = self._vq_prefixes()
        codes = np.zeros((len(prefixes), t_len), np.int64)
        margins = np.zeros((len(prefixes), t_len))
        residual = z.copy()
        for cb, (p, _) in enumerate(prefixes):
            e = self.w(f"{p}.in_proj.weight")[:, :, 0] @ residual + self.w(f"{p}.in_proj.bias")[:, None]
            book = self.w(f"{p}.codebook.weight")
            e_n = e / np.sqrt(np.maximum((e * e).sum(axis=0, keepdims=True), 1e-12))
            b_n = book / np.sqrt(np.maximum((book * book).sum(axis=1, keepdims=True), 1e-12))
            cos = b_n @ e_n                                                   # [size, T]
            best = np.argmax(cos, axis=0)                                     # first maximum
            ranked = np.sort(cos, axis=0)
            margins[cb] = ranked[-1] - ranked[-2] if len(book) > 1 else np.inf
            codes[cb] = best
            chosen = book[best].T
            residual = residual - (self.w(f"{p}.out_proj.weight")[:, :, 0] @ chosen
                                   + self.w(f"{p}.out_proj.bias")[:, None])
        return EncodeReference(codes, margins, z)
