"""`s2core decode` and `s2core encode`: codes (.npy, [num_codebooks, T] as fish-speech and
s2.cpp lay them out) to a WAV file, and a recording to reference codes."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from s2core.errors import InvalidInputError


def add_parsers(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("decode", help="codes (.npy, [num_codebooks, T]) -> 44.1 kHz mono WAV")
    d.add_argument("model", help="a full S2 Pro GGUF (c.* tensors) or a codec-only GGUF")
    d.add_argument("codes", help=".npy of integer codes [num_codebooks, T], semantic row first")
    d.add_argument("--wav", required=True, help="output WAV (16-bit PCM, mono)")
    d.add_argument("--stream", action="store_true",
                   help="decode with the streaming decoder, --push frames at a time")
    d.add_argument("--push", type=int, default=1, help="frames per push with --stream (default 1)")
    d.add_argument("--backend", default=None, help="backend name (default: auto)")
    e = sub.add_parser("encode", help="a recording -> reference codes (.npy)")
    e.add_argument("model", help="a full S2 Pro GGUF or a codec-only GGUF")
    e.add_argument("audio", help="WAV (or any format soundfile reads); resampled to the codec's rate")
    e.add_argument("--out", required=True, help="output .npy, int32 [num_codebooks, T]")
    e.add_argument("--backend", default=None, help="backend name (default: auto)")


def _load_codes(path: str) -> np.ndarray:
    try:
        codes = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InvalidInputError("codes_file", f"{path}: not a readable .npy array ({exc})") from exc
    return codes


def cmd_decode(args: argparse.Namespace) -> int:
    import s2core

    from s2core.codec.audio import write_wav
    if args.push < 1:
        raise InvalidInputError("push", f"--push must be >= 1, got {args.push}")
    codes = _load_codes(args.codes)
    with s2core.load_codec(args.model, backend=args.backend) as codec:
        codes = codec.check_codes(codes)
        t0 = time.perf_counter()
        first = None
        if args.stream:
            stream = codec.stream_decoder()
            parts = []
            for start in range(0, codes.shape[1], args.push):
                parts.append(stream.push(codes[:, start:start + args.push]))
                first = first if first is not None else time.perf_counter() - t0
            parts.append(stream.flush())
            audio = np.concatenate(parts)
        else:
            audio = codec.decode(codes)
        elapsed = time.perf_counter() - t0
        write_wav(args.wav, audio, codec.sample_rate)
        seconds = len(audio) / codec.sample_rate
        how = f"streamed {args.push} frame(s) a push, first audio after {first:.3f} s" \
            if args.stream else "one shot"
        print(f"{codes.shape[1]} frames -> {seconds:.2f} s of audio at {codec.sample_rate} Hz in "
              f"{elapsed:.2f} s on {codec.backend_name} ({how}; "
              f"{seconds / elapsed if elapsed > 0 else float('inf'):.2f} s of audio a second)")
        print(f"wrote {Path(args.wav)}")
    return 0


def cmd_encode(args: argparse.Namespace) -> int:
    import s2core

    from s2core.codec.audio import read_audio, resample
    audio, rate = read_audio(args.audio)
    with s2core.load_codec(args.model, backend=args.backend) as codec:
        audio = resample(audio, rate, codec.sample_rate)
        t0 = time.perf_counter()
        codes = codec.encode(audio)
        elapsed = time.perf_counter() - t0
        np.save(args.out, codes)
        resampled = f" (resampled from {rate} Hz)" if rate != codec.sample_rate else ""
        print(f"{len(audio) / codec.sample_rate:.2f} s at {codec.sample_rate} Hz{resampled} -> "
              f"codes {list(codes.shape)} in {elapsed:.2f} s on {codec.backend_name}")
        print(f"wrote {Path(args.out)}")
    return 0


COMMANDS = {"decode": cmd_decode, "encode": cmd_encode}
