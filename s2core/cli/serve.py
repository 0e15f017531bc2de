"""`s2core serve [MODEL.gguf]`: the model over HTTP (s2core.http), on uvicorn.

Without MODEL it serves the embedded default model with its tokenizer and reference voice
(the voice `default`), so it works right after install, as `s2core demo` does. SIGTERM (or
Ctrl-C) stops taking requests, lets the running ones finish for --grace seconds, then exits.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from s2core.errors import InvalidInputError

ENV_API_KEY = "S2CORE_API_KEY"


def add_arguments(p: Any) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="GGUF model file (s2.cpp's; default: the embedded default model)")
    p.add_argument("--tokenizer", default=None,
                   help="the model's tokenizer.json (needed with MODEL)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--voices-dir", metavar="DIR", default=None,
                   help="voice directory (default $S2CORE_VOICES, else ./voices; the "
                        "embedded model's: the cache's voices/)")
    p.add_argument("--max-sequences", type=int, default=None,
                   help="requests generated together (default: what the backend batches)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for a slot; one more gets 429 (default 64)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' (default ${ENV_API_KEY})")
    p.add_argument("--backend", default=None, help="backend name (default: auto)")
    p.add_argument("--codec-backend", default=None, help="codec backend (default: auto)")
    p.add_argument("--max-input-chars", type=int, default=4096,
                   help="longest text a request may send (OpenAI's cap, default 4096)")
    p.add_argument("--max-upload-mb", type=float, default=20.0,
                   help="largest reference recording a request may send (default 20 MB)")
    p.add_argument("--max-reference-seconds", type=float, default=30.0,
                   help="longest reference recording (default 30 s)")
    p.add_argument("--slot-positions", type=int, default=None,
                   help="positions each slot holds (default: the context length, at most "
                        "4096)")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds running requests may take to finish after SIGTERM")
    from s2core.cli.serve_replicas import add_replica_arguments
    add_replica_arguments(p)


def run_command(args: Any) -> int:
    from s2core.cli.serve_replicas import run_replicated, wants_replicas
    if wants_replicas(args):
        return run_replicated(args, api_key=args.api_key or os.environ.get(ENV_API_KEY) or None)
    try:
        import uvicorn
        from s2core.http.app import create_app
        from s2core.http.engine import Engine
        from s2core.http.synthesis import Limits
    except ImportError as exc:
        print(f"s2core serve needs the serve extra (pip install 's2core[serve]'): {exc}",
              file=sys.stderr)
        return 2
    for name in ("max_input_chars", "port"):
        if getattr(args, name) < 1:
            raise InvalidInputError(name, f"--{name.replace('_', '-')} must be >= 1")
    if args.model is not None and args.tokenizer is None:
        raise InvalidInputError("tokenizer", "a model file needs --tokenizer tokenizer.json")
    api_key = args.api_key or os.environ.get(ENV_API_KEY) or None
    engine = Engine.from_args(args.model, args.tokenizer, voices_dir=args.voices_dir,
                              backend=args.backend, codec_backend=args.codec_backend,
                              max_sequences=args.max_sequences, max_queue=args.max_queue,
                              slot_positions=args.slot_positions)
    limits = Limits(max_input_chars=args.max_input_chars,
                    max_upload_bytes=int(args.max_upload_mb * 1024 * 1024),
                    max_reference_seconds=args.max_reference_seconds)
    app = create_app(engine, api_key=api_key, limits=limits)
    caps = engine.model.capabilities
    print(f"s2core serve: {engine.model_name} on {engine.model.backend.name} "
          f"({caps.device}), {engine.max_sequences} sequences at a time, voices in "
          f"{engine.library.directory}; http://{args.host}:{args.port}/"
          + (" (API key required)" if api_key else ""), file=sys.stderr, flush=True)
    # uvicorn drains on SIGTERM, then raises the signal again under the handler it found:
    # with this one the drained server exits 0 instead of dying by the signal
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info",
                timeout_graceful_shutdown=args.grace)
    return 0
