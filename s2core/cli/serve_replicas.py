"""`s2core serve --replicas N` (or an autoscaling range): the same HTTP API on Ray Serve
replicas (s2core.cluster), on a local Ray instance or the cluster at --ray-address."""

from __future__ import annotations

import sys
from typing import Any

from s2core.errors import InvalidInputError


def add_replica_arguments(p: Any) -> None:
    g = p.add_argument_group("replicas (Ray Serve; the ray extra)")
    g.add_argument("--replicas", type=int, default=None, metavar="N",
                   help="serve from N Ray Serve replicas, each with the model and its own "
                        "batch of --max-sequences; requests in one voice go to a replica that "
                        "holds its prefix; --max-queue requests wait for a free slot on any")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="join this Ray cluster (`auto`: the one this machine is in; default: "
                        "start a local Ray instance)")
    g.add_argument("--min-replicas", type=int, default=None,
                   help="autoscale: the fewest replicas (with --max-replicas)")
    g.add_argument("--max-replicas", type=int, default=None,
                   help="autoscale: the most replicas")
    g.add_argument("--target-ongoing-requests", type=float, default=None,
                   help="autoscale: requests per replica to aim at (default: its slots)")


def wants_replicas(args: Any) -> bool:
    return any(getattr(args, name, None) is not None for name in
               ("replicas", "min_replicas", "max_replicas", "ray_address"))


def run_replicated(args: Any, api_key: str | None) -> int:
    """`args`: those of `s2core serve`, with the ones above."""
    try:
        from s2core.cluster.launch import serve_replicated
    except ImportError as exc:
        print(f"s2core serve --replicas needs the ray extra (pip install 's2core[ray]'): "
              f"{exc}", file=sys.stderr)
        return 2
    from s2core.cluster.ray_app import engine_options
    from s2core.cluster.scaling import Scaling
    from s2core.http.synthesis import Limits

    if args.model is not None and args.tokenizer is None:
        raise InvalidInputError("tokenizer", "a model file needs --tokenizer tokenizer.json")
    autoscaled = args.min_replicas is not None or args.max_replicas is not None
    if autoscaled and args.replicas is not None:
        raise InvalidInputError("replicas", "give --replicas or --min-replicas/--max-replicas, "
                                "not both")
    scaling = Scaling(replicas=None if autoscaled else (1 if args.replicas is None
                                                        else args.replicas),
                      min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                      target_ongoing=args.target_ongoing_requests,
                      max_sequences=(_backend_batch(args.backend, args.model)
                                     if args.max_sequences is None else args.max_sequences),
                      max_queue=args.max_queue)
    options = engine_options(args.model, args.tokenizer, args.voices_dir, args.backend,
                             args.codec_backend, scaling)
    options["slot_positions"] = args.slot_positions
    app_options = {"api_key": api_key,
                   "limits": Limits(max_input_chars=args.max_input_chars,
                                    max_upload_bytes=int(args.max_upload_mb * 1024 * 1024),
                                    max_reference_seconds=args.max_reference_seconds)}
    return serve_replicated(options, scaling, app_options=app_options, host=args.host,
                            port=args.port, ray_address=args.ray_address,
                            say=lambda msg: print(f"s2core serve: {msg}", file=sys.stderr,
                                                  flush=True))


def _backend_batch(backend: str | None, model: str | None) -> int:
    """The sequences the chosen backend evaluates in one call (the engine's default)."""
    import s2core
    name = backend or s2core.default_backend(model)
    for row in s2core.list_backends():
        if row.name == name and row.capabilities is not None:
            return row.capabilities.max_batch_sequences
    raise InvalidInputError("backend", f"no available backend named {name!r}")
