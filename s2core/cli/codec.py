"""`s2core decode` and `s2core encode`: codes (.npy, [num_codebooks, T] as fish-speech and
s2.cpp lay them out) to a WAV file, and a recording to reference codes."""

from __future__ import annotations

import argparse
import time


from s2core.codec.codes_file import MAX_FRAMES, read_codes, write_codes
from s2core.errors import InvalidInputError
from s2core.fileio import check_output


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (a bad value is argparse's one-line usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def add_parsers(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("decode", help="codes (.npy, [num_codebooks, T]) -> 44.1 kHz mono WAV")
    d.add_argument("model", help="a full S2 Pro GGUF (c.* tensors) or a codec-only GGUF")
    d.add_argument("codes", help=".npy of integer codes [num_codebooks, T], semantic row first")
    d.add_argument("--wav", required=True, help="output WAV (16-bit PCM, mono)")
    d.add_argument("--stream", action="store_true",
                   help="decode with the streaming decoder, --push frames at a time")
    d.add_argument("--push", type=int, default=1, help="frames per push with --stream (default 1)")
    d.add_argument("--backend", default=None, help="backend name (default: auto)")
    d.add_argument("--max-frames", type=positive_int, default=MAX_FRAMES,
                   help=f"refuse codes files of more frames (default {MAX_FRAMES}, ~30 min)")
    e = sub.add_parser("encode", help="a recording -> reference codes (.npy)")
    e.add_argument("model", help="a full S2 Pro GGUF or a codec-only GGUF")
    e.add_argument("audio", help="WAV (or any format soundfile reads); resampled to the codec's rate")
    e.add_argument("--out", required=True, help="output .npy, int32 [num_codebooks, T]")
    e.add_argument("--backend", default=None, help="backend name (default: auto)")
    e.add_argument("--max-seconds", type=positive_float, default=60.0,
                   help="refuse longer recordings, checked from the header (default 60)")


def cmd_decode(args: argparse.Namespace) -> int:
    import s2core

    from s2core.codec.audio import WavWriter, write_wav
    if args.push < 1:
        raise InvalidInputError("push", f"--push must be >= 1, got {args.push}")
    wav_path = check_output(args.wav, (args.model, args.codes), _output_error, "--wav")
    codes = read_codes(args.codes, args.max_frames)
    with s2core.load_codec(args.model, backend=args.backend) as codec:
        codes = codec.check_codes(codes)
        t0 = time.perf_counter()
        first = None
        if args.stream:  # each push's audio goes straight to the file: memory stays flat
            stream = codec.stream_decoder()
            with WavWriter(wav_path, codec.sample_rate) as wav:
                for start in range(0, codes.shape[1], args.push):
                    wav.write(stream.push(codes[:, start:start + args.push]))
                    first = first if first is not None else time.perf_counter() - t0
                wav.write(stream.flush())
                samples = wav.samples
        else:
            audio = codec.decode(codes)
            write_wav(wav_path, audio, codec.sample_rate)
            samples = len(audio)
        elapsed = time.perf_counter() - t0
        seconds = samples / codec.sample_rate
        how = f"streamed {args.push} frame(s) a push, first audio after {first:.3f} s" \
            if args.stream else "one shot"
        print(f"{codes.shape[1]} frames -> {seconds:.2f} s of audio at {codec.sample_rate} Hz in "
              f"{elapsed:.2f} s on {codec.backend_name} ({how}; "
              f"{seconds / elapsed if elapsed > 0 else float('inf'):.2f} s of audio a second)")
        print(f"wrote {wav_path}")
    return 0


def cmd_encode(args: argparse.Namespace) -> int:
    import s2core

    from s2core.codec.audio import AudioLimits, probe_audio, read_for_codec
    out_path = check_output(args.out, (args.model, args.audio), _output_error, "--out")
    limits = AudioLimits(max_seconds=args.max_seconds)
    rate, _, _ = probe_audio(args.audio, limits)  # refused before the codec is loaded
    with s2core.load_codec(args.model, backend=args.backend) as codec:
        audio = read_for_codec(args.audio, codec.sample_rate, limits)
        t0 = time.perf_counter()
        codes = codec.encode(audio)
        elapsed = time.perf_counter() - t0
        write_codes(out_path, codes)
        resampled = f" (resampled from {rate} Hz)" if rate != codec.sample_rate else ""
        print(f"{len(audio) / codec.sample_rate:.2f} s at {codec.sample_rate} Hz{resampled} -> "
              f"codes {list(codes.shape)} in {elapsed:.2f} s on {codec.backend_name}")
        print(f"wrote {out_path}")
    return 0


def _output_error(message: str, check: str) -> InvalidInputError:
    return InvalidInputError(check, message)


COMMANDS = {"decode": cmd_decode, "encode": cmd_encode}
