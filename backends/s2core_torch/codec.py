"""The PyTorch backend's codec: conv1d for kernels > 1 (oneDNN on the CPU, cuDNN on CUDA),
addmm for 1x1 convs and ConvTransposes (torch's CPU conv paths for those shapes are slow im2col /
col2im ones), fused SDPA attention, float32 throughout (F16 files are widened once on load).

Activations are channels-first [1, C, L]. Every op of the decode path is causal (CODEC.md 4), so
a push runs each conv on its input with the rows it reaches back to on top (zeros at the start
of a stream): padding=0, no cropping. A ConvTranspose with kernel 2s reads the previous input
too (one matrix product per tap). The post_module attends over its last window - 1 frames' K/V, kept
after RoPE, with positions continuing across pushes: the state is bounded, so a frame costs the
same at frame 10 and frame 1000, and frames pushed one at a time give the one-shot samples.

On CUDA the convolutions run with TF32 off (cuDNN's default is on, ~1e-3 off float32): the
codec declares float32 compute. CUDA is written the same way but untested here (no GPU).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from s2core.plugin import CodecBackend, CodecCapabilities
from s2core.plugin import CodecFile
from s2core.plugin import DecodeState, HistoryPass
from s2core.plugin import Conv, ConvNeXt, ConvTranspose, ResidualUnit, Transformer

from .options import _resolve_device
from .plugin import torch_codec_capabilities

#: one-shot decode runs as exact pushes of this many frames: bounds activations on the CPU;
#: CUDA takes longer pushes (fewer launches)
DECODE_CHUNK_FRAMES = {"cpu": 64, "cuda": 1024}
#: queries per attention call (bounds the mask and score matrices of long one-shot decodes)
ATTENTION_BLOCK = 512


class _Pass(HistoryPass):
    """One push; time runs along the last axis ([1, C, L])."""

    def zeros(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        return x.new_zeros((1, x.shape[1], rows))

    def join(self, before: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([before, x], dim=2)

    def last(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        return x[:, :, x.shape[2] - rows:].clone()


class _Weights:
    """Tensors as float32 copies on the device (F16 and BF16 widened once)."""

    def __init__(self, f: CodecFile, device: torch.device):
        self.f, self.device = f, device

    def __call__(self, name: str) -> torch.Tensor:
        return torch.from_numpy(self.f.tensor(name)).to(self.device)


def snake(x: torch.Tensor, alpha: torch.Tensor, inv_alpha: torch.Tensor) -> torch.Tensor:
    """x + sin(alpha x)^2 / alpha; alpha, inv_alpha [1, C, 1]."""
    y = torch.sin(x * alpha)
    y.square_()
    return torch.addcmul(x, y, inv_alpha)


class SnakeOp:
    def __init__(self, w: _Weights, name: str):
        self.alpha = w(name).reshape(1, -1, 1)
        self.inv_alpha = 1.0 / self.alpha

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return snake(x, self.alpha, self.inv_alpha)


class ConvOp:
    """conv1d (oneDNN / cuDNN) for kernels > 1; a 1x1 conv is one addmm (torch sends those to
    a slow im2col path on the CPU)."""

    def __init__(self, w: _Weights, c: Conv):
        self.weight, self.bias = w(c.weight), w(c.bias)
        self.history, self.stride, self.dilation = c.history, c.stride, c.dilation
        self.groups = c.c_out if c.depthwise else 1
        self.matrix = (self.weight[:, :, 0].contiguous()
                       if c.kernel == 1 and c.stride == 1 and not c.depthwise else None)

    def __call__(self, xh: torch.Tensor) -> torch.Tensor:
        if self.matrix is not None:
            return torch.addmm(self.bias[:, None], self.matrix, xh[0])[None]
        return F.conv1d(xh, self.weight, self.bias, stride=self.stride, dilation=self.dilation,
                        groups=self.groups)


class ConvTransposeOp:
    """A ConvTranspose as products: output block t (s samples of C_out) is W_lo^T x_t (+ W_hi^T
    x_{t-1} for kernel 2s, whose previous input comes first in `xh`). One [s C_out, C_in]
    matrix per tap, rows (channel, sample); torch's conv_transpose1d falls back to slow paths
    on the CPU for these shapes."""

    def __init__(self, w: _Weights, c: ConvTranspose):
        weight, s = w(c.weight), c.stride           # [C_in, C_out, K]
        blocks = [weight[:, :, s:2 * s], weight[:, :, :s]] if c.overlap else [weight[:, :, :s]]
        self.taps = [b.permute(1, 2, 0).reshape(c.c_out * s, c.c_in).contiguous() for b in blocks]
        self.bias = w(c.bias).repeat_interleave(s)[:, None]
        self.history, self.stride, self.c_out = len(blocks) - 1, s, c.c_out

    def __call__(self, xh: torch.Tensor) -> torch.Tensor:
        x = xh[0]
        n = x.shape[1] - self.history
        z = torch.addmm(self.bias, self.taps[0], x[:, :n])
        for k, tap in enumerate(self.taps[1:], 1):
            z.addmm_(tap, x[:, k:k + n])
        # rows (channel, sample j) x columns t -> channel x (t s + j)
        return z.view(self.c_out, self.stride, n).transpose(1, 2).reshape(1, self.c_out, n * self.stride)


class ResidualUnitOp:
    def __init__(self, w: _Weights, u: ResidualUnit):
        self.name = u.conv1.name
        self.snake1, self.snake2 = SnakeOp(w, u.snake1.alpha), SnakeOp(w, u.snake2.alpha)
        self.conv1, self.conv2 = ConvOp(w, u.conv1), ConvOp(w, u.conv2)

    def __call__(self, x: torch.Tensor, p: _Pass) -> torch.Tensor:
        y = self.conv1(p.extend(self.name, self.snake1(x), self.conv1.history))
        return x + self.conv2(self.snake2(y))


class ConvNeXtOp:
    def __init__(self, w: _Weights, c: ConvNeXt):
        self.name = c.dwconv.name
        self.dwconv = ConvOp(w, c.dwconv)
        self.norm_w, self.norm_b = w(c.name("norm.weight")), w(c.name("norm.bias"))
        self.w1, self.b1 = w(c.name("pwconv1.weight")), w(c.name("pwconv1.bias"))
        self.w2, self.b2 = w(c.name("pwconv2.weight")), w(c.name("pwconv2.bias"))
        self.gamma = w(c.name("gamma"))

    def __call__(self, x: torch.Tensor, p: _Pass) -> torch.Tensor:
        y = self.dwconv(p.extend(self.name, x, self.dwconv.history))[0].T   # [L, D]
        y = F.layer_norm(y, (y.shape[1],), self.norm_w, self.norm_b, eps=1e-6)
        y = F.gelu(F.linear(y, self.w1, self.b1))
        y = F.linear(y, self.w2, self.b2) * self.gamma
        return x + y.T[None]


class TransformerOp:
    """The codec's windowed causal transformer on tokens [T, width]."""

    def __init__(self, w: _Weights, tf: Transformer):
        self.tf = tf
        self.layers = [{a: w(n) for a, n in tf.layer(k).items()} for k in range(tf.n_layers)]
        self.norm = w(tf.norm)
        self.inv_freq = torch.tensor(
            tf.rope_base ** (-np.arange(0, tf.head_dim, 2, dtype=np.float64) / tf.head_dim))
        self.device = self.norm.device

    @property
    def kept(self) -> int | None:
        return self.tf.window - 1 if self.tf.window > 0 else None

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, heads, hd]: adjacent pairs rotated; angles in float64 on the host."""
        ang = positions.double()[:, None] * self.inv_freq[None, :]
        rot = torch.polar(torch.ones_like(ang), ang).to(torch.complex64).to(self.device)
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(xc * rot[:, None, :]).flatten(-2)

    def __call__(self, x: torch.Tensor, position: int = 0, kv: tuple = ()) -> tuple[torch.Tensor, tuple]:
        tf = self.tf
        t_len = x.shape[0]
        h, hkv, hd = tf.n_head, tf.n_kv_head, tf.head_dim
        positions = torch.arange(position, position + t_len)
        new_kv = []
        for i, w in enumerate(self.layers):
            a = F.rms_norm(x, (x.shape[1],), w["attention_norm"], tf.eps)
            qkv = F.linear(a, w["wqkv"])
            q = self._rope(qkv[:, :h * hd].reshape(t_len, h, hd), positions)
            k = self._rope(qkv[:, h * hd:(h + hkv) * hd].reshape(t_len, hkv, hd), positions)
            v = qkv[:, (h + hkv) * hd:].reshape(t_len, hkv, hd)
            k, v = k.transpose(0, 1), v.transpose(0, 1)          # [hkv, T, hd]
            if kv:
                k = torch.cat([kv[i][0], k], dim=1)
                v = torch.cat([kv[i][1], v], dim=1)
            attn = self._attention(q.transpose(0, 1), k, v, position)   # [T, h * hd]
            x = x + w["attention_scale"] * F.linear(attn, w["wo"])
            a = F.rms_norm(x, (x.shape[1],), w["ffn_norm"], tf.eps)
            x = x + w["ffn_scale"] * F.linear(F.silu(F.linear(a, w["w1"])) * F.linear(a, w["w3"]), w["w2"])
            keep = k.shape[1] if self.kept is None else min(self.kept, k.shape[1])
            new_kv.append((k[:, k.shape[1] - keep:].clone(), v[:, v.shape[1] - keep:].clone()))
        return F.rms_norm(x, (x.shape[1],), self.norm, tf.eps), tuple(new_kv)

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position: int) -> torch.Tensor:
        """q [H, T, hd] at positions position..; k, v [Hkv, Lk, hd] ending at the last query.
        Key j is visible to query t iff t - window < j <= t (a boolean mask for SDPA)."""
        tf = self.tf
        h, t_len, hd = q.shape
        lk = k.shape[1]
        key_pos = torch.arange(position + t_len - lk, position + t_len, device=self.device)
        out = []
        for start in range(0, t_len, ATTENTION_BLOCK):
            stop = min(t_len, start + ATTENTION_BLOCK)
            q0, q1 = position + start, position + stop - 1
            lo = 0 if tf.window <= 0 else max(0, q0 - tf.window + 1 - int(key_pos[0]))
            hi = q1 - int(key_pos[0]) + 1
            kp = key_pos[lo:hi]
            qpos = torch.arange(q0, q1 + 1, device=self.device)
            mask = kp[None, :] <= qpos[:, None]
            if tf.window > 0:
                mask &= kp[None, :] > qpos[:, None] - tf.window
            out.append(F.scaled_dot_product_attention(q[:, start:stop], k[:, lo:hi], v[:, lo:hi],
                                                      attn_mask=mask, enable_gqa=h != k.shape[0]))
        return torch.cat(out, dim=1).transpose(0, 1).reshape(t_len, h * hd)


class TorchCodec(CodecBackend):
    name = "torch"

    def __init__(self, codec_file: CodecFile, device: Any = None):
        super().__init__(codec_file)
        self.device = _resolve_device(device)
        w = _Weights(codec_file, self.device)
        q, dec = self.layout.quantizer, self.layout.decoder
        with torch.inference_mode():
            # RVQ decode (CODEC.md 4.2) as a lookup of each codebook's rows projected to D
            self.tables = [w(vq.codebook) @ w(vq.out_proj.weight)[:, :, 0].T + w(vq.out_proj.bias)
                           for vq in q.codebooks]
        self.offsets = torch.tensor(np.cumsum([0] + [len(t) for t in self.tables[:-1]]),
                                    device=self.device)
        self.table = torch.cat(self.tables)
        self.post_module = TransformerOp(w, q.post_module)
        self.upsample = [(ConvTransposeOp(w, c), ConvNeXtOp(w, cnx)) for c, cnx in q.upsample]
        self.conv_in = ConvOp(w, dec.conv_in)
        self.blocks = [(SnakeOp(w, b.snake.alpha), ConvTransposeOp(w, b.upsample),
                        [ResidualUnitOp(w, u) for u in b.units]) for b in dec.blocks]
        self.snake_out = SnakeOp(w, dec.snake_out.alpha)
        self.conv_out = ConvOp(w, dec.conv_out)
        self._weights = w
        self._encoder: _Encoder | None = None
        self._caps = torch_codec_capabilities(str(self.device))

    @property
    def capabilities(self) -> CodecCapabilities:
        return self._caps

    def _precise(self):
        """float32 convolutions on CUDA (cuDNN would use TF32); nothing to do on the CPU."""
        if self.device.type == "cuda":
            return torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=False,
                                              allow_tf32=False)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ decode
    def begin_stream(self) -> DecodeState:
        return DecodeState.fresh()

    def decode(self, codes: np.ndarray) -> np.ndarray:
        chunk = DECODE_CHUNK_FRAMES[self.device.type]
        state, parts = self.begin_stream(), []
        for start in range(0, codes.shape[1], chunk):
            audio, state = self.decode_stream(state, codes[:, start:start + chunk])
            parts.append(audio)
        return np.concatenate(parts)

    @torch.inference_mode()
    def decode_stream(self, state: DecodeState, codes: np.ndarray) -> tuple[np.ndarray, DecodeState]:
        with self._precise():
            p = _Pass(state)
            ids = torch.from_numpy(codes.astype(np.int64)).to(self.device) + self.offsets[:, None]
            z = self.table[ids].sum(dim=0)                              # [T, D]
            z, kv = self.post_module(z, state.position, state.kv)
            x = z.T[None].contiguous()                                  # [1, D, T]
            for conv, cnx in self.upsample:
                x = cnx(conv(x), p)
            x = self.conv_in(p.extend("conv_in", x, self.conv_in.history))
            for i, (snake_op, conv, units) in enumerate(self.blocks):
                x = conv(p.extend(f"block{i}", snake_op(x), conv.history))
                for u in units:
                    x = u(x, p)
            x = self.conv_out(p.extend("conv_out", self.snake_out(x), self.conv_out.history))
            audio = torch.tanh(x[0, 0]).cpu().numpy()
        return audio, p.state(state.position + codes.shape[1], kv)

    # ------------------------------------------------------------------ encode
    @torch.inference_mode()
    def encode(self, audio: np.ndarray) -> np.ndarray:
        if self._encoder is None:
            self._encoder = _Encoder(self._weights, self.layout)
        with self._precise():
            x = torch.from_numpy(np.ascontiguousarray(audio, np.float32)).to(self.device)
            return self._encoder(x[None, None]).cpu().numpy().astype(np.int32)

    def close(self) -> None:
        self.tables, self.blocks, self.upsample = [], [], []
        self._encoder = None


class _Encoder:
    """Audio -> codes (CODEC.md 5), loaded on first use."""

    def __init__(self, w: _Weights, layout):
        enc, q = layout.encoder, layout.quantizer
        self.conv_in = ConvOp(w, enc.conv_in)
        self.blocks = [([ResidualUnitOp(w, u) for u in b.units], SnakeOp(w, b.snake.alpha),
                        ConvOp(w, b.conv), None if b.transformer is None else TransformerOp(w, b.transformer))
                       for b in enc.blocks]
        self.snake_out = SnakeOp(w, enc.snake_out.alpha)
        self.conv_out = ConvOp(w, enc.conv_out)
        self.downsample = [(ConvOp(w, c), ConvNeXtOp(w, cnx)) for c, cnx in q.downsample]
        self.pre_module = TransformerOp(w, q.pre_module)
        self.vqs = [(w(vq.in_proj.weight)[:, :, 0], w(vq.in_proj.bias), w(vq.codebook),
                     w(vq.out_proj.weight)[:, :, 0], w(vq.out_proj.bias)) for vq in q.codebooks]

    @staticmethod
    def _strided(conv: ConvOp, x: torch.Tensor) -> torch.Tensor:
        """CODEC.md 4 "Causal conv" padding: Ke - s zeros left, up to whole strides right."""
        s = conv.stride
        ke = conv.history + 1
        right = -(-x.shape[2] // s) * s - x.shape[2]
        return conv(F.pad(x, (ke - s, right)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        p = _Pass(DecodeState.fresh())  # fresh: zero history before every stride-1 conv
        x = self._strided(self.conv_in, x)
        for units, snake_op, conv, tf in self.blocks:
            for u in units:
                x = u(x, p)
            x = self._strided(conv, snake_op(x))
            if tf is not None:
                x = tf(x[0].T.contiguous())[0].T[None]
        x = self._strided(self.conv_out, self.snake_out(x))
        for conv, cnx in self.downsample:
            x = cnx(self._strided(conv, x), p)
        z = self.pre_module(x[0].T.contiguous())[0]                  # [T, D]
        return self._quantize(z)

    def _quantize(self, z: torch.Tensor) -> torch.Tensor:
        """Residual VQ per frame (CODEC.md 5.4): largest cosine, first maximum."""
        residual = z.clone()
        codes = []
        for w_in, b_in, book, w_out, b_out in self.vqs:
            e = _normalized(F.linear(residual, w_in, b_in))
            best = torch.argmax(e @ _normalized(book).T, dim=1)
            codes.append(best)
            residual = residual - F.linear(book[best], w_out, b_out)
        return torch.stack(codes)


def _normalized(v: torch.Tensor) -> torch.Tensor:
    return v / torch.sqrt(torch.clamp((v * v).sum(dim=1, keepdim=True), min=1e-12))


