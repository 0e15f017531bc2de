"""The S2 Pro audio codec (CODEC.md): codes <-> 44.1 kHz audio, read from the same GGUF.

    import s2core
    codec = s2core.load_codec("s2-pro-f16.gguf")   # or a codec-only file
    audio = codec.decode(codes)                     # codes [num_codebooks, T] -> float32
    stream = codec.stream_decoder()                 # push frames as they come
    codes = codec.encode(audio)                     # a reference voice from a recording

Read top-down: hparams (the keys), layout (the structure), file (open and check), backend (the
contract a backend's codec fulfils), model (the object users hold), selection (which backend).
"""

from s2core.codec.backend import CodecBackend, CodecCapabilities
from s2core.codec.file import CodecFile
from s2core.codec.hparams import CodecHparams, TransformerHparams
from s2core.codec.model import Codec, CodecClosedError, StreamDecoder

__all__ = ["Codec", "CodecBackend", "CodecCapabilities", "CodecClosedError", "CodecFile",
           "CodecHparams", "StreamDecoder", "TransformerHparams"]
