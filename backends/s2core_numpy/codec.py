"""The NumPy backend's codec: float32 on BLAS, activations time-major [L, C].

Every convolution of the codec is a causal one (CODEC.md 4), and each is computed the same way:
the input with its history rows on top (the previous inputs the kernel reaches back to: zeros
at the start of a stream), unrolled into rows of `kernel` taps (im2col, a strided view copied
one chunk of rows at a time to bound memory), times one weight matrix (one sgemm per chunk).
The transposed convolutions fit the same mould: output block t of a ConvTranspose with kernel
2s and stride s reads inputs t-1 and t, so it is a 2-tap conv with s * C_out outputs per step,
and the one with kernel = stride a 1-tap one; `[L, s * C]` is then `[L * s, C]` in place.

Streaming keeps, per op, the input rows its next call reaches back to, plus the post_module's
K/V of the last window - 1 frames and the next RoPE position: a frame costs the same at frame
10 and frame 1000, and pushing frames one by one gives the one-shot samples.
"""

from __future__ import annotations


import numpy as np
from numpy.lib.stride_tricks import as_strided

from s2core.plugin import CodecBackend, CodecCapabilities
from s2core.plugin import CodecFile
from s2core.plugin import DecodeState, HistoryPass
from s2core.plugin import (Conv, ConvNeXt, ConvTranspose, ResidualUnit,
                                 Transformer)

from .plugin import numpy_codec_capabilities

#: rows of one im2col chunk: about this many bytes, and at least IM2COL_MIN_ROWS rows (sgemm
#: with fewer rows re-reads the weight matrix too often)
IM2COL_CHUNK_BYTES = 4 << 20
IM2COL_MIN_ROWS = 1024
#: outputs below which a conv sums per-tap products instead (the final conv to mono: an im2col
#: copy of 7 C values a row would cost more than its product)
FEW_OUTPUTS = 16
#: queries per attention block (bounds the score matrix for long one-shot decodes)
ATTENTION_BLOCK = 256
#: one-shot decode runs as pushes of this many frames (exact): bounds the activations
DECODE_CHUNK_FRAMES = 64
F32 = np.float32


# ---------------------------------------------------------------------- operations
def erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7): NumPy has no erf, and GELU needs one.
    Evaluated in float64 (only ConvNeXt's activations at the latent rate take it: cheap), so
    float32 rounding adds nothing to the formula's own error."""
    a = np.abs(x, dtype=np.float64)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                          + t * 1.061405429))))
    return np.copysign(1.0 - poly * np.exp(-a * a), x).astype(x.dtype)


def gelu(x: np.ndarray) -> np.ndarray:
    return F32(0.5) * x * (F32(1.0) + erf(x * F32(0.7071067811865476)))


def silu(x: np.ndarray) -> np.ndarray:
    return x * (F32(0.5) + F32(0.5) * np.tanh(F32(0.5) * x))


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    ms = np.einsum("ij,ij->i", x, x) / F32(x.shape[1])
    return x * (1.0 / np.sqrt(ms + F32(eps)))[:, None] * weight


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    mean = x.mean(axis=1, keepdims=True)
    d = x - mean
    var = np.einsum("ij,ij->i", d, d)[:, None] / F32(x.shape[1])
    return d * (1.0 / np.sqrt(var + F32(eps))) * weight + bias


class SnakeOp:
    """y = x + sin(alpha x)^2 / alpha, in place on a scratch copy (five passes, no temporaries)."""

    def __init__(self, alpha: np.ndarray):
        self.alpha = alpha.reshape(-1).astype(F32)
        self.inv_alpha = (F32(1.0) / self.alpha).astype(F32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = np.multiply(x, self.alpha)
        np.sin(y, out=y)
        np.multiply(y, y, out=y)
        y *= self.inv_alpha
        y += x
        return y


class ConvOp:
    """A causal conv as im2col + one sgemm per chunk. `wm` is [kernel * C_in, C_out] with rows
    ordered (tap, channel), tap 0 the oldest input."""

    def __init__(self, wm: np.ndarray, bias: np.ndarray, kernel: int, dilation: int = 1,
                 stride: int = 1):
        self.wm = np.ascontiguousarray(wm, dtype=F32)
        self.bias = np.ascontiguousarray(bias, dtype=F32)
        self.kernel, self.dilation, self.stride = kernel, dilation, stride
        self.c_in = self.wm.shape[0] // kernel
        self.history = (kernel - 1) * dilation

    @classmethod
    def from_conv(cls, f: CodecFile, c: Conv) -> "ConvOp":
        w = f.tensor(c.weight)  # [C_out, C_in, K]
        return cls(w.transpose(2, 1, 0).reshape(c.kernel * c.c_in, c.c_out), f.tensor(c.bias),
                   c.kernel, c.dilation, c.stride)

    @classmethod
    def from_transpose(cls, f: CodecFile, c: ConvTranspose) -> "ConvOp":
        """ConvTranspose as a conv with s * C_out outputs a step: taps (t-1, t) for kernel 2s
        (input t-1 meets weight taps s..2s-1), or (t,) for kernel = stride."""
        w = f.tensor(c.weight)  # [C_in, C_out, K]; output j of block t: sum_i x_t[i] w[i, :, j]
        s = c.stride
        blocks = [w[:, :, s:2 * s], w[:, :, :s]] if c.overlap else [w[:, :, :s]]
        # [C_in, C_out, s] -> [C_in, s * C_out] so a row's outputs are (sample j, channel)
        wm = np.concatenate([b.transpose(0, 2, 1).reshape(c.c_in, s * c.c_out) for b in blocks])
        return cls(wm, np.tile(f.tensor(c.bias), s), len(blocks))

    def __call__(self, xh: np.ndarray) -> np.ndarray:
        """xh [history + L, C_in] (history/padding rows on top) -> [n_out, C_out]."""
        xh = np.ascontiguousarray(xh, dtype=F32)
        n_out = (xh.shape[0] - self.history - 1) // self.stride + 1
        c_out = self.wm.shape[1]
        if self.kernel == 1 and self.stride == 1:
            out = xh @ self.wm
        elif c_out < FEW_OUTPUTS and self.stride == 1:
            out = xh[:n_out] @ self.wm[:self.c_in]
            for k in range(1, self.kernel):
                rows = xh[k * self.dilation:k * self.dilation + n_out]
                out += rows @ self.wm[k * self.c_in:(k + 1) * self.c_in]
        else:
            out = np.empty((n_out, c_out), F32)
            row = self.kernel * self.c_in
            chunk = max(IM2COL_MIN_ROWS, IM2COL_CHUNK_BYTES // (4 * row))
            buf = np.empty((min(chunk, n_out), self.kernel, self.c_in), F32)
            item = xh.itemsize
            for start in range(0, n_out, chunk):
                n = min(chunk, n_out - start)
                first = xh[start * self.stride:]
                taps = as_strided(first, shape=(n, self.kernel, self.c_in),
                                  strides=(self.stride * self.c_in * item,
                                           self.dilation * self.c_in * item, item),
                                  writeable=False)
                np.copyto(buf[:n], taps)
                np.matmul(buf[:n].reshape(n, row), self.wm, out=out[start:start + n])
        out += self.bias
        return out


class DepthwiseOp:
    """ConvNeXt's depthwise causal conv k7: a sum of 7 shifted, per-channel scaled inputs."""

    def __init__(self, f: CodecFile, c: Conv):
        self.taps = np.ascontiguousarray(f.tensor(c.weight)[:, 0, :].T)  # [K, C]
        self.bias = f.tensor(c.bias)
        self.history = c.history

    def __call__(self, xh: np.ndarray) -> np.ndarray:
        n = xh.shape[0] - self.history
        out = xh[:n] * self.taps[0]
        for k in range(1, len(self.taps)):
            out += xh[k:k + n] * self.taps[k]
        out += self.bias
        return out


# ---------------------------------------------------------------------- streaming state
class _Pass(HistoryPass):
    """One push; time runs down the rows ([L, C])."""

    def zeros(self, x: np.ndarray, rows: int) -> np.ndarray:
        return np.zeros((rows, x.shape[1]), F32)

    def join(self, before: np.ndarray, x: np.ndarray) -> np.ndarray:
        return np.concatenate([before, x])

    def last(self, x: np.ndarray, rows: int) -> np.ndarray:
        return x[x.shape[0] - rows:].copy()


# ---------------------------------------------------------------------- modules
class ResidualUnitOp:
    def __init__(self, f: CodecFile, u: ResidualUnit):
        self.name = u.conv1.name
        self.snake1, self.snake2 = SnakeOp(f.tensor(u.snake1.alpha)), SnakeOp(f.tensor(u.snake2.alpha))
        self.conv1, self.conv2 = ConvOp.from_conv(f, u.conv1), ConvOp.from_conv(f, u.conv2)

    def __call__(self, x: np.ndarray, p: _Pass) -> np.ndarray:
        y = self.conv1(p.extend(self.name, self.snake1(x), self.conv1.history))
        y = self.conv2(self.snake2(y))
        y += x
        return y


class ConvNeXtOp:
    def __init__(self, f: CodecFile, c: ConvNeXt):
        self.name = c.dwconv.name
        self.dwconv = DepthwiseOp(f, c.dwconv)
        t = f.tensor
        self.norm_w, self.norm_b = t(c.name("norm.weight")), t(c.name("norm.bias"))
        self.w1, self.b1 = np.ascontiguousarray(t(c.name("pwconv1.weight")).T), t(c.name("pwconv1.bias"))
        self.w2, self.b2 = np.ascontiguousarray(t(c.name("pwconv2.weight")).T), t(c.name("pwconv2.bias"))
        self.gamma = t(c.name("gamma"))

    def __call__(self, x: np.ndarray, p: _Pass) -> np.ndarray:
        y = self.dwconv(p.extend(self.name, x, self.dwconv.history))
        y = layer_norm(y, self.norm_w, self.norm_b)
        y = gelu(y @ self.w1 + self.b1)
        y = y @ self.w2 + self.b2
        y *= self.gamma
        y += x
        return y


class TransformerOp:
    """The codec's windowed causal transformer, time-major x [T, width]."""

    def __init__(self, f: CodecFile, tf: Transformer):
        self.tf = tf
        self.layers = []
        for k in range(tf.n_layers):
            names = tf.layer(k)
            w = {a: f.tensor(n) for a, n in names.items()}
            for a in ("wqkv", "wo", "w1", "w3", "w2"):
                w[a] = np.ascontiguousarray(w[a].T)  # x @ w
            self.layers.append(w)
        self.norm = f.tensor(tf.norm)
        self.inv_freq = tf.rope_base ** (-np.arange(0, tf.head_dim, 2, dtype=np.float64) / tf.head_dim)

    @property
    def kept(self) -> int | None:
        """K/V positions a later query can see: window - 1 (None: all, plain causal)."""
        return self.tf.window - 1 if self.tf.window > 0 else None

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Adjacent pairs rotated; angles formed in float64 so long streams keep precision."""
        ang = positions.astype(np.float64)[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(ang).astype(F32)[:, None, :], np.sin(ang).astype(F32)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def __call__(self, x: np.ndarray, position: int = 0, kv: tuple = ()) -> tuple[np.ndarray, tuple]:
        """x [T, w] at positions position.. after the K/V `kv` (per layer) -> (y, new kv)."""
        tf = self.tf
        t_len = x.shape[0]
        h, hkv, hd = tf.n_head, tf.n_kv_head, tf.head_dim
        positions = np.arange(position, position + t_len)
        new_kv = []
        for i, w in enumerate(self.layers):
            a = rms_norm(x, w["attention_norm"], tf.eps)
            qkv = a @ w["wqkv"]
            q = self._rope(qkv[:, :h * hd].reshape(t_len, h, hd), positions)
            k = self._rope(qkv[:, h * hd:(h + hkv) * hd].reshape(t_len, hkv, hd), positions)
            v = qkv[:, (h + hkv) * hd:].reshape(t_len, hkv, hd)
            k, v = k.transpose(1, 0, 2), v.transpose(1, 0, 2)       # [hkv, T, hd]
            if kv:
                k = np.concatenate([kv[i][0], k], axis=1)
                v = np.concatenate([kv[i][1], v], axis=1)
            attn = self._attention(q, k, v, position)
            x = x + w["attention_scale"] * (attn @ w["wo"])
            a = rms_norm(x, w["ffn_norm"], tf.eps)
            x = x + w["ffn_scale"] * ((silu(a @ w["w1"]) * (a @ w["w3"])) @ w["w2"])
            keep = k.shape[1] if self.kept is None else min(self.kept, k.shape[1])
            new_kv.append((k[:, k.shape[1] - keep:].copy(), v[:, v.shape[1] - keep:].copy()))
        return rms_norm(x, self.norm, tf.eps), tuple(new_kv)

    def _attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, position: int) -> np.ndarray:
        """q [T, H, hd] at positions position..; k, v [Hkv, Lk, hd] ending at the last query.
        Key j is visible to query t iff t - window < j <= t. Blocks of queries bound memory."""
        tf = self.tf
        t_len, h, hd = q.shape
        hkv, lk = k.shape[0], k.shape[1]
        group = h // hkv
        key_pos = np.arange(position + t_len - lk, position + t_len)
        out = np.empty((t_len, h * hd), F32)
        scale = F32(1.0 / np.sqrt(hd))
        for start in range(0, t_len, ATTENTION_BLOCK):
            stop = min(t_len, start + ATTENTION_BLOCK)
            qpos = np.arange(position + start, position + stop)
            lo = 0 if tf.window <= 0 else max(0, int(np.searchsorted(key_pos, qpos[0] - tf.window + 1)))
            hi = int(np.searchsorted(key_pos, qpos[-1], side="right"))
            kb, vb, kp = k[:, lo:hi], v[:, lo:hi], key_pos[lo:hi]
            n = stop - start
            qg = q[start:stop].reshape(n, hkv, group, hd).transpose(1, 2, 0, 3).reshape(hkv, group * n, hd)
            scores = np.matmul(qg, kb.transpose(0, 2, 1)).reshape(hkv, group, n, hi - lo)
            scores *= scale
            visible = kp[None, :] <= qpos[:, None]
            if tf.window > 0:
                visible &= kp[None, :] > qpos[:, None] - tf.window
            scores = np.where(visible, scores, F32(-np.inf))
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            o = np.matmul(scores.reshape(hkv, group * n, hi - lo), vb)
            out[start:stop] = o.reshape(hkv, group, n, hd).transpose(2, 0, 1, 3).reshape(n, h * hd)
        return out


# ---------------------------------------------------------------------- the codec
class NumpyCodec(CodecBackend):
    name = "numpy"

    def __init__(self, codec_file: CodecFile):
        super().__init__(codec_file)
        f, lay = codec_file, codec_file.layout
        q, dec = lay.quantizer, lay.decoder
        # RVQ decode (CODEC.md 4.2) as a lookup: each codebook's rows already projected to D
        self.tables = [f.tensor(vq.codebook) @ f.tensor(vq.out_proj.weight)[:, :, 0].T
                       + f.tensor(vq.out_proj.bias) for vq in q.codebooks]
        self.post_module = TransformerOp(f, q.post_module)
        self.upsample = [(ConvOp.from_transpose(f, c), c.stride, ConvNeXtOp(f, cnx))
                         for c, cnx in q.upsample]
        self.conv_in = ConvOp.from_conv(f, dec.conv_in)
        self.blocks = [(SnakeOp(f.tensor(b.snake.alpha)), ConvOp.from_transpose(f, b.upsample),
                        b.upsample.stride, [ResidualUnitOp(f, u) for u in b.units])
                       for b in dec.blocks]
        self.snake_out = SnakeOp(f.tensor(dec.snake_out.alpha))
        self.conv_out = ConvOp.from_conv(f, dec.conv_out)
        self._encoder: _Encoder | None = None
        self._caps = numpy_codec_capabilities()

    @property
    def capabilities(self) -> CodecCapabilities:
        return self._caps

    # ------------------------------------------------------------------ decode
    def begin_stream(self) -> DecodeState:
        return DecodeState.fresh()

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """One-shot: pushes of DECODE_CHUNK_FRAMES frames from a fresh state (exact), so the
        activations of a long utterance are never all held at once."""
        state, parts = self.begin_stream(), []
        for start in range(0, codes.shape[1], DECODE_CHUNK_FRAMES):
            audio, state = self.decode_stream(state, codes[:, start:start + DECODE_CHUNK_FRAMES])
            parts.append(audio)
        return np.concatenate(parts)

    def decode_stream(self, state: DecodeState, codes: np.ndarray) -> tuple[np.ndarray, DecodeState]:
        p = _Pass(state)
        z = self.tables[0][codes[0]]
        for table, row in zip(self.tables[1:], codes[1:]):
            z += table[row]
        z, kv = self.post_module(z, state.position, state.kv)
        for conv, stride, cnx in self.upsample:
            z = conv(z).reshape(-1, conv.wm.shape[1] // stride)
            z = cnx(z, p)
        x = self.conv_in(p.extend("conv_in", z, self.conv_in.history))
        for i, (snake, conv, stride, units) in enumerate(self.blocks):
            x = conv(p.extend(f"block{i}", snake(x), conv.history))
            x = x.reshape(-1, conv.wm.shape[1] // stride)
            for u in units:
                x = u(x, p)
        x = self.conv_out(p.extend("conv_out", self.snake_out(x), self.conv_out.history))
        audio = np.tanh(x[:, 0])
        return audio, p.state(state.position + codes.shape[1], kv)

    # ------------------------------------------------------------------ encode
    def encode(self, audio: np.ndarray) -> np.ndarray:
        if self._encoder is None:
            self._encoder = _Encoder(self.codec_file)
        return self._encoder(audio)

    def close(self) -> None:
        self.tables = []
        self.blocks = []
        self._encoder = None


class _Encoder:
    """Audio -> codes (CODEC.md 5), loaded on first use (decode-only users never pay for it)."""

    def __init__(self, f: CodecFile):
        lay = f.layout
        enc, q = lay.encoder, lay.quantizer
        self.hp = f.hparams
        self.conv_in = ConvOp.from_conv(f, enc.conv_in)
        self.blocks = [([ResidualUnitOp(f, u) for u in b.units], SnakeOp(f.tensor(b.snake.alpha)),
                        ConvOp.from_conv(f, b.conv),
                        None if b.transformer is None else TransformerOp(f, b.transformer))
                       for b in enc.blocks]
        self.snake_out = SnakeOp(f.tensor(enc.snake_out.alpha))
        self.conv_out = ConvOp.from_conv(f, enc.conv_out)
        self.downsample = [(ConvOp.from_conv(f, c), ConvNeXtOp(f, cnx)) for c, cnx in q.downsample]
        self.pre_module = TransformerOp(f, q.pre_module)
        self.vqs = [(f.tensor(vq.in_proj.weight)[:, :, 0].T.copy(), f.tensor(vq.in_proj.bias),
                     _normalized(f.tensor(vq.codebook)), f.tensor(vq.codebook),
                     f.tensor(vq.out_proj.weight)[:, :, 0].T.copy(), f.tensor(vq.out_proj.bias))
                    for vq in q.codebooks]

    @staticmethod
    def _strided(conv: ConvOp, x: np.ndarray) -> np.ndarray:
        """CODEC.md 4 "Causal conv" padding for any stride: Ke - s zeros on the left, then
        enough on the right for ceil(L / s) outputs."""
        ke, s = conv.history + 1, conv.stride
        n_out = -(-x.shape[0] // s)
        right = n_out * s - x.shape[0]
        return conv(np.concatenate([np.zeros((ke - s, x.shape[1]), F32), x,
                                    np.zeros((right, x.shape[1]), F32)]))

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        p = _Pass(DecodeState.fresh())  # a fresh pass: zero history on every stride-1 conv
        x = self._strided(self.conv_in, audio.reshape(-1, 1))
        for units, snake, conv, tf in self.blocks:
            for u in units:
                x = u(x, p)
            x = self._strided(conv, snake(x))
            if tf is not None:
                x, _ = tf(x)
        x = self._strided(self.conv_out, self.snake_out(x))
        for conv, cnx in self.downsample:
            x = cnx(self._strided(conv, x), p)
        z, _ = self.pre_module(x)
        return self._quantize(z)

    def _quantize(self, z: np.ndarray) -> np.ndarray:
        """Residual VQ per frame (CODEC.md 5.4): the code of largest cosine, first maximum."""
        residual = z.copy()
        codes = np.empty((len(self.vqs), z.shape[0]), np.int32)
        for cb, (w_in, b_in, book_n, book, w_out, b_out) in enumerate(self.vqs):
            e = _normalized(residual @ w_in + b_in)
            best = np.argmax(e @ book_n.T, axis=1)
            codes[cb] = best
            residual -= book[best] @ w_out + b_out
        return codes


def _normalized(v: np.ndarray) -> np.ndarray:
    """Rows divided by sqrt(max(|v|^2, 1e-12)), as s2.cpp normalises (CODEC.md 5.4)."""
    return v / np.sqrt(np.maximum(np.einsum("ij,ij->i", v, v), F32(1e-12)))[:, None]
