"""The MLX backend's codec: mx.conv1d / mx.conv_transpose1d, mx.fast attention, RoPE and norms,
float32 throughout (F16 files widened once on load).

Activations are MLX's channels-last [1, L, C]. Every op of the decode path is causal (CODEC.md
4), so a push runs each conv over its input with the rows it reaches back to on top (zeros at
the start of a stream) and no padding; a ConvTranspose with kernel 2s gets the previous input
too and drops its first output block. The post_module keeps its last window - 1 frames' K/V
(after RoPE) and RoPE positions continue across pushes: frames pushed one at a time give the
one-shot samples at a flat cost per frame.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from s2core.plugin import CodecBackend, CodecCapabilities
from s2core.plugin import CodecFile
from s2core.plugin import DecodeState, HistoryPass
from s2core.plugin import Conv, ConvNeXt, ConvTranspose, ResidualUnit, Transformer

from .plugin import is_apple_silicon, mlx_codec_capabilities

#: one-shot decode runs as exact pushes of this many frames (bounds the activations)
DECODE_CHUNK_FRAMES = 64


class _Pass(HistoryPass):
    """One push; time runs along axis 1 ([1, L, C])."""

    def zeros(self, x: mx.array, rows: int) -> mx.array:
        return mx.zeros((1, rows, x.shape[2]), dtype=x.dtype)

    def join(self, before: mx.array, x: mx.array) -> mx.array:
        return mx.concatenate([before, x], axis=1)

    def last(self, x: mx.array, rows: int) -> mx.array:
        return x[:, x.shape[1] - rows:]  # MLX arrays are immutable: a slice cannot change


class _Weights:
    def __init__(self, f: CodecFile):
        self.f = f

    def __call__(self, name: str) -> mx.array:
        return mx.array(self.f.tensor(name))


class SnakeOp:
    def __init__(self, w: _Weights, name: str):
        self.alpha = w(name).reshape(1, 1, -1)
        self.inv_alpha = 1.0 / self.alpha

    def __call__(self, x: mx.array) -> mx.array:
        return x + mx.square(mx.sin(x * self.alpha)) * self.inv_alpha


class ConvOp:
    def __init__(self, w: _Weights, c: Conv):
        self.weight = w(c.weight).transpose(0, 2, 1)     # [C_out, K, C_in (1 if depthwise)]
        self.bias = w(c.bias)
        self.history, self.stride, self.dilation = c.history, c.stride, c.dilation
        self.groups = c.c_out if c.depthwise else 1

    def __call__(self, xh: mx.array) -> mx.array:
        return mx.conv1d(xh, self.weight, stride=self.stride, dilation=self.dilation,
                         groups=self.groups) + self.bias


class ConvTransposeOp:
    def __init__(self, w: _Weights, c: ConvTranspose):
        self.weight = w(c.weight).transpose(1, 2, 0)     # [C_in, C_out, K] -> [C_out, K, C_in]
        self.bias, self.stride = w(c.bias), c.stride
        self.history = 1 if c.overlap else 0

    def __call__(self, xh: mx.array) -> mx.array:
        y = mx.conv_transpose1d(xh, self.weight, stride=self.stride) + self.bias
        s = self.stride
        if self.history:  # [from the previous input] [inputs 0..L-1] [last s: dropped]
            return y[:, s:y.shape[1] - s]
        return y


class ResidualUnitOp:
    def __init__(self, w: _Weights, u: ResidualUnit):
        self.name = u.conv1.name
        self.snake1, self.snake2 = SnakeOp(w, u.snake1.alpha), SnakeOp(w, u.snake2.alpha)
        self.conv1, self.conv2 = ConvOp(w, u.conv1), ConvOp(w, u.conv2)

    def __call__(self, x: mx.array, p: _Pass) -> mx.array:
        y = self.conv1(p.extend(self.name, self.snake1(x), self.conv1.history))
        return x + self.conv2(self.snake2(y))


class ConvNeXtOp:
    def __init__(self, w: _Weights, c: ConvNeXt):
        self.name = c.dwconv.name
        self.dwconv = ConvOp(w, c.dwconv)
        self.norm_w, self.norm_b = w(c.name("norm.weight")), w(c.name("norm.bias"))
        self.w1, self.b1 = w(c.name("pwconv1.weight")).T, w(c.name("pwconv1.bias"))
        self.w2, self.b2 = w(c.name("pwconv2.weight")).T, w(c.name("pwconv2.bias"))
        self.gamma = w(c.name("gamma"))

    def __call__(self, x: mx.array, p: _Pass) -> mx.array:
        y = self.dwconv(p.extend(self.name, x, self.dwconv.history))
        y = mx.fast.layer_norm(y, self.norm_w, self.norm_b, 1e-6)
        y = nn.gelu(y @ self.w1 + self.b1)
        return x + (y @ self.w2 + self.b2) * self.gamma


class TransformerOp:
    """The codec's windowed causal transformer on tokens [T, width]."""

    def __init__(self, w: _Weights, tf: Transformer):
        self.tf = tf
        self.layers = []
        for k in range(tf.n_layers):
            layer = {a: w(n) for a, n in tf.layer(k).items()}
            for a in ("wqkv", "wo", "w1", "w3", "w2"):
                layer[a] = layer[a].T
            self.layers.append(layer)
        self.norm = w(tf.norm)

    @property
    def kept(self) -> int | None:
        return self.tf.window - 1 if self.tf.window > 0 else None

    def _rope(self, x: mx.array, position: int) -> mx.array:
        # traditional=True rotates adjacent pairs (x[2i], x[2i+1]): ggml's mode 0 (CODEC.md 4)
        return mx.fast.rope(x, self.tf.head_dim, traditional=True, base=self.tf.rope_base,
                            scale=1.0, offset=position)

    def __call__(self, x: mx.array, position: int = 0, kv: tuple = ()) -> tuple[mx.array, tuple]:
        tf = self.tf
        t_len = x.shape[0]
        h, hkv, hd = tf.n_head, tf.n_kv_head, tf.head_dim
        new_kv = []
        for i, w in enumerate(self.layers):
            a = mx.fast.rms_norm(x, w["attention_norm"], tf.eps)
            qkv = a @ w["wqkv"]
            q = qkv[:, :h * hd].reshape(t_len, h, hd).transpose(1, 0, 2)[None]
            k = qkv[:, h * hd:(h + hkv) * hd].reshape(t_len, hkv, hd).transpose(1, 0, 2)[None]
            v = qkv[:, (h + hkv) * hd:].reshape(t_len, hkv, hd).transpose(1, 0, 2)[None]
            q, k = self._rope(q, position), self._rope(k, position)
            if kv:
                k = mx.concatenate([kv[i][0], k], axis=2)
                v = mx.concatenate([kv[i][1], v], axis=2)
            lk = k.shape[2]
            qpos = mx.arange(position, position + t_len)[:, None]
            kpos = mx.arange(position + t_len - lk, position + t_len)[None, :]
            mask = kpos <= qpos
            if tf.window > 0:
                mask = mask & (kpos > qpos - tf.window)
            attn = mx.fast.scaled_dot_product_attention(q, k, v, scale=hd ** -0.5, mask=mask)
            attn = attn[0].transpose(1, 0, 2).reshape(t_len, h * hd)
            x = x + w["attention_scale"] * (attn @ w["wo"])
            a = mx.fast.rms_norm(x, w["ffn_norm"], tf.eps)
            x = x + w["ffn_scale"] * ((nn.silu(a @ w["w1"]) * (a @ w["w3"])) @ w["w2"])
            keep = lk if self.kept is None else min(self.kept, lk)
            new_kv.append((k[:, :, lk - keep:], v[:, :, lk - keep:]))
        return mx.fast.rms_norm(x, self.norm, tf.eps), tuple(new_kv)


class MlxCodec(CodecBackend):
    name = "mlx"

    def __init__(self, codec_file: CodecFile):
        super().__init__(codec_file)
        w = _Weights(codec_file)
        q, dec = self.layout.quantizer, self.layout.decoder
        # RVQ decode (CODEC.md 4.2) as a lookup of each codebook's rows projected to D
        tables = [w(vq.codebook) @ w(vq.out_proj.weight)[:, :, 0].T + w(vq.out_proj.bias)
                  for vq in q.codebooks]
        self.offsets = mx.array(np.cumsum([0] + [t.shape[0] for t in tables[:-1]]))
        self.table = mx.concatenate(tables)
        self.post_module = TransformerOp(w, q.post_module)
        self.upsample = [(ConvTransposeOp(w, c), ConvNeXtOp(w, cnx)) for c, cnx in q.upsample]
        self.conv_in = ConvOp(w, dec.conv_in)
        self.blocks = [(SnakeOp(w, b.snake.alpha), ConvTransposeOp(w, b.upsample),
                        [ResidualUnitOp(w, u) for u in b.units]) for b in dec.blocks]
        self.snake_out = SnakeOp(w, dec.snake_out.alpha)
        self.conv_out = ConvOp(w, dec.conv_out)
        mx.eval(self.table)
        self._weights = w
        self._encoder: _Encoder | None = None
        self._caps = mlx_codec_capabilities(metal=is_apple_silicon())

    @property
    def capabilities(self) -> CodecCapabilities:
        return self._caps

    def begin_stream(self) -> DecodeState:
        return DecodeState.fresh()

    def decode(self, codes: np.ndarray) -> np.ndarray:
        state, parts = self.begin_stream(), []
        for start in range(0, codes.shape[1], DECODE_CHUNK_FRAMES):
            audio, state = self.decode_stream(state, codes[:, start:start + DECODE_CHUNK_FRAMES])
            parts.append(audio)
        return np.concatenate(parts)

    def decode_stream(self, state: DecodeState, codes: np.ndarray) -> tuple[np.ndarray, DecodeState]:
        p = _Pass(state)
        ids = mx.array(codes.astype(np.int32)) + self.offsets[:, None]
        z = self.table[ids].sum(axis=0)                                  # [T, D]
        z, kv = self.post_module(z, state.position, state.kv)
        x = z[None]                                                       # [1, T, D]
        for conv, cnx in self.upsample:
            x = cnx(conv(x), p)
        x = self.conv_in(p.extend("conv_in", x, self.conv_in.history))
        for i, (snake_op, conv, units) in enumerate(self.blocks):
            x = conv(p.extend(f"block{i}", snake_op(x), conv.history))
            for u in units:
                x = u(x, p)
        x = self.conv_out(p.extend("conv_out", self.snake_out(x), self.conv_out.history))
        audio = mx.tanh(x[0, :, 0])
        mx.eval(audio, p.new, kv)  # the state is materialised: a later push reads no graph
        return np.array(audio, dtype=np.float32), p.state(state.position + codes.shape[1], kv)

    def encode(self, audio: np.ndarray) -> np.ndarray:
        if self._encoder is None:
            self._encoder = _Encoder(self._weights, self.layout)
        codes = self._encoder(mx.array(np.ascontiguousarray(audio, np.float32))[None, :, None])
        return np.array(codes, dtype=np.int32)

    def close(self) -> None:
        self.blocks, self.upsample = [], []
        self._encoder = None


class _Encoder:
    """Audio -> codes (CODEC.md 5), loaded on first use."""

    def __init__(self, w: _Weights, layout: Any):
        enc, q = layout.encoder, layout.quantizer
        self.conv_in = ConvOp(w, enc.conv_in)
        self.blocks = [([ResidualUnitOp(w, u) for u in b.units], SnakeOp(w, b.snake.alpha),
                        ConvOp(w, b.conv), None if b.transformer is None else TransformerOp(w, b.transformer))
                       for b in enc.blocks]
        self.snake_out = SnakeOp(w, enc.snake_out.alpha)
        self.conv_out = ConvOp(w, enc.conv_out)
        self.downsample = [(ConvOp(w, c), ConvNeXtOp(w, cnx)) for c, cnx in q.downsample]
        self.pre_module = TransformerOp(w, q.pre_module)
        self.vqs = [(w(vq.in_proj.weight)[:, :, 0].T, w(vq.in_proj.bias), w(vq.codebook),
                     w(vq.out_proj.weight)[:, :, 0].T, w(vq.out_proj.bias)) for vq in q.codebooks]

    @staticmethod
    def _strided(conv: ConvOp, x: mx.array) -> mx.array:
        """CODEC.md 4 "Causal conv" padding: Ke - s zeros left, up to whole strides right."""
        s, ke, length = conv.stride, conv.history + 1, x.shape[1]
        right = -(-length // s) * s - length
        return conv(mx.pad(x, [(0, 0), (ke - s, right), (0, 0)]))

    def __call__(self, x: mx.array) -> mx.array:
        p = _Pass(DecodeState.fresh())
        x = self._strided(self.conv_in, x)
        for units, snake_op, conv, tf in self.blocks:
            for u in units:
                x = u(x, p)
            x = self._strided(conv, snake_op(x))
            if tf is not None:
                x = tf(x[0])[0][None]
        x = self._strided(self.conv_out, self.snake_out(x))
        for conv, cnx in self.downsample:
            x = cnx(self._strided(conv, x), p)
        residual = self.pre_module(x[0])[0]                               # [T, D]
        codes = []
        for w_in, b_in, book, w_out, b_out in self.vqs:
            e = _normalized(residual @ w_in + b_in)
            best = mx.argmax(e @ _normalized(book).T, axis=1)
            codes.append(best)
            residual = residual - (book[best] @ w_out + b_out)
        return mx.stack(codes)


def _normalized(v: mx.array) -> mx.array:
    return v * mx.rsqrt(mx.maximum((v * v).sum(axis=1, keepdims=True), 1e-12))
