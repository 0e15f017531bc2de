"""The `s2core` command: backends, info, demo, speak, serve, voices, bench, decode, encode."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

import s2core

from s2core.cli import codec as codec_commands
from s2core.errors import InvalidInputError, S2CoreError
from s2core.modelfile.file import ModelFile
from s2core.runtime.memory import (backend_kv_cache_bytes, copied_weight_bytes, holdings, kv_cache_bytes,
                     resident_weight_bytes)


def _gb(n: float) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


def cmd_backends(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps([r.as_dict() for r in s2core.list_backends()], indent=1))
        return 0
    # each row as its probe answers: a slow probe delays only its own row (listed as timed
    # out when the limit is reached), then the default, which needs every row
    shown: list = []
    rows = s2core.get_registry().list(on_row=lambda r: (shown.append(r), _print_backend(r)))
    for r in rows:
        if not any(r is s for s in shown):
            _print_backend(r)  # a plugin that failed to load
    try:
        default = s2core.default_backend()
    except S2CoreError as exc:
        print(f"no default backend: {exc}")
        return 0
    print(f"default: {default} (set {s2core.contract.registry.ENV_BACKEND} to choose another)")
    return 0


def _print_backend(r: "s2core.BackendInfo") -> None:
    """One row of `s2core backends`."""
    state = "available  " if r.available else "UNAVAILABLE"
    print(f"  {r.name:<10} priority {r.priority:>4}  {state} {r.reason}", flush=True)
    print(f"    from {r.source}")
    c = r.capabilities
    if c is not None:
        held = (f", held as {c.kv_cache_held_dtype}" if c.kv_cache_held_dtype != c.kv_cache_dtype
                else "")
        print(f"    device {c.device}, accelerator {c.accelerator}, compute {c.compute_dtype}, "
              f"KV cache {c.kv_cache_dtype}{held} (offers "
              f"{', '.join(c.supported_kv_cache_dtypes)})")
        print(f"    keeps as stored: {', '.join(sorted(c.native_weight_types))}; widens other "
              f"types to {c.widened_weight_dtype}"
              + (" ; single-token semantic prefill" if c.requires_single_token_semantic_prefill
                 else ""))
        if c.codec is not None:
            k = c.codec
            print(f"    codec: {k.compute_dtype} on {k.device}, "
                  f"{'exact streaming' if k.streaming else 'windowed streaming'}, "
                  f"{'encodes' if k.encode else 'decode only'}, codec priority "
                  f"{k.priority if k.priority is not None else r.priority}")
    if r.options:
        print("    options: " + "; ".join(f"{o.name}={o.allowed()} (default {o.default!r})"
                                       for o in r.options))
    sys.stdout.flush()


def cmd_info(args: argparse.Namespace) -> int:
    if isinstance(args.ctx, bool) or not 1 <= args.ctx <= 1 << 31:
        raise InvalidInputError("ctx", f"--ctx must be in [1, {1 << 31}], got {args.ctx}")
    mf = ModelFile(args.model)
    hp = mf.hparams
    print(f"file         {mf.path} ({_gb(mf.file_size)})")
    print(f"architecture {hp.architecture}")
    for key, value in hp.as_dict().items():
        if key != "fast":
            print(f"  {key:<28}{value}")
    if hp.fast is not None:
        print("fast-AR")
        for key, value in hp.fast.__dict__.items():
            print(f"  {key:<28}{value}")
    by_type: Counter = Counter()
    count: Counter = Counter()
    for t in mf.model_tensors():
        by_type[t.type_name] += t.n_bytes
        count[t.type_name] += 1
    print("tensor types (used tensors)")
    for name, nbytes in sorted(by_type.items()):
        print(f"  {name:<8}{count[name]:>5} tensors {_gb(nbytes):>12}")
    print(f"  total weights {_gb(mf.weight_bytes)}; ignored tensors (codec c.* and others): "
          f"{len(mf.extra_tensor_names)}")
    print(_codec_line(args.model))
    print(f"KV cache at {args.ctx} positions: " + ", ".join(
        f"{d} {_gb(kv_cache_bytes(hp, args.ctx, d))}" for d in ("f16", "bf16", "f32")))
    print("memory on each backend (weights as held after load + KV cache), as each probe "
          "answers:", flush=True)
    s2core.get_registry().list(on_row=lambda r: _print_memory(mf, r, args.ctx))
    print(f"load() would pick {s2core.default_backend(args.model)}")
    return 0


def _print_memory(mf: ModelFile, r: "s2core.BackendInfo", ctx: int) -> None:
    """One backend's lines of `s2core info`."""
    hp = mf.hparams
    if r.capabilities is None:
        print(f"  {r.name:<10} {r.reason}", flush=True)  # timed out, failed: no numbers
        return
    weights = resident_weight_bytes(mf, r.capabilities)
    widened = any(not r.capabilities.keeps_native(t.type_name) for t in mf.model_tensors())
    note = f" (widens to {r.capabilities.widened_weight_dtype})" if widened else ""
    if copied_weight_bytes(mf, r.capabilities) == 0:
        note += " (used in place from the file's memory map)"
    state = "" if r.available else " [unavailable here]"
    print(f"  {r.name:<10} weights {_gb(weights):>12}{note}, + cache "
          f"{_gb(backend_kv_cache_bytes(hp, ctx, r.capabilities))}{state}")
    for h in holdings(mf, r.capabilities):
        how = ("kept as stored" if h.kept
               else f"widened to {r.capabilities.widened_weight_dtype}")
        print(f"    {h.type_name:<6} {h.n_tensors:>4} tensors {how:<18} holds "
              f"{_gb(h.held_bytes):>12} ({h.held_bytes / h.file_bytes:.2f}x the file's "
              f"{_gb(h.file_bytes)})")
    sys.stdout.flush()


def _codec_line(path: str) -> str:
    """Whether the file carries the audio codec (`speak --wav` needs one)."""
    from s2core.codec.file import CodecFile
    from s2core.errors import ModelFileError
    try:
        cf = CodecFile(path)
    except ModelFileError as exc:
        return f"codec        none usable: {exc} (speak --wav then needs --codec FILE)"
    try:
        hp = cf.hparams
        encoder = "encoder too" if cf.can_encode else "decode only"
        types = sorted({cf.type_name(n) for n in cf.layout.decode_tensors()})
        return (f"codec        {hp.sample_rate} Hz, {hp.samples_per_frame} samples a frame, "
                f"{hp.num_codebooks} codebooks (semantic {hp.codebook_sizes[0]} codes, "
                f"residual {hp.codebook_sizes[-1]}), "
                f"{_gb(cf.weight_bytes)} {'/'.join(types)}, {encoder}")
    finally:
        cf.close()


def cmd_demo(args: argparse.Namespace) -> int:
    from s2core.cli.demo import run_demo
    run_demo(backend=args.backend, steps=args.steps, weight_type=args.weight_type, seed=args.seed,
             export=args.export, wav=args.wav)
    return 0


def cmd_speak(args: argparse.Namespace) -> int:
    from s2core.cli.speak import run_command
    return run_command(args)


def cmd_serve(args: argparse.Namespace) -> int:
    from s2core.cli.serve import run_command
    return run_command(args)


def cmd_voices(args: argparse.Namespace) -> int:
    from s2core.voice.library import list_command
    return list_command(args.voices_dir, sys.stdout)


def cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    from s2core.benchmarking.cli import main as bench_main
    return bench_main(rest)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="s2core", description=__doc__)
    p.add_argument("--version", action="version", version=f"s2core {s2core.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("backends", help="registered backends, availability and capabilities")
    b.add_argument("--json", action="store_true")
    i = sub.add_parser("info", help="hparams, tensor types and memory of a GGUF model")
    i.add_argument("model")
    i.add_argument("--ctx", type=int, default=4096, help="KV cache length to size (positions)")
    d = sub.add_parser("demo", help="speak a sentence into a WAV with the embedded default model")
    d.add_argument("--backend", default=None, help="backend name (default: auto)")
    d.add_argument("--steps", type=int, default=32)
    d.add_argument("--weight-type", default="f16")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--export", metavar="DIR", default=None,
                   help="write the demo's model, tokenizer and reference voice into DIR (for "
                        "trying `s2core speak`) and print the commands")
    from s2core.cli.demo import DEMO_WAV
    d.add_argument("--wav", default=DEMO_WAV, help=f"where the speech goes (default {DEMO_WAV})")
    v = sub.add_parser("voices", help="saved voices (.s2voice) and their stored KV prefixes")
    v.add_argument("--voices-dir", metavar="DIR", default=None,
                   help="voice directory (default $S2CORE_VOICES, else ./voices)")
    s = sub.add_parser("speak", help="text (and a reference voice) to speech (WAV) or codes")
    from s2core.cli.speak import add_arguments
    add_arguments(s)
    sv = sub.add_parser("serve", help="serve the model over HTTP (OpenAI, fish-speech and "
                        "s2.cpp protocols, a page to try it)")
    from s2core.cli.serve import add_arguments as add_serve_arguments
    add_serve_arguments(sv)
    sub.add_parser("bench", help="benchmarks (see `s2core bench --help`)", add_help=False)
    codec_commands.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if argv and argv[0] == "bench":  # the benchmark parses its own options
        return cmd_bench(argparse.Namespace(), argv[1:])
    args = parser.parse_args(argv)
    try:
        commands = {"backends": cmd_backends, "info": cmd_info, "demo": cmd_demo,
                    "speak": cmd_speak, "serve": cmd_serve, "voices": cmd_voices, **codec_commands.COMMANDS}
        return commands[args.command](args)
    except S2CoreError as exc:
        print(f"s2core: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path the user gave that the system refused (full disk, ...)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"s2core: error: [os_error] {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


def _one_line(message: str, limit: int = 2000) -> str:
    """A message as one bounded line (a hostile path or file can hold newlines)."""
    text = " ".join(message.split("\n"))
    return text if len(text) <= limit else text[:limit] + "..."


if __name__ == "__main__":
    sys.exit(main())
