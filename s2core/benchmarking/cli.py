"""`s2core bench [options]`: run the benchmark, print the tables, write JSON, PNG and markdown."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
from pathlib import Path

from s2core.benchmarking.config import DEFAULT_OUT, DEFAULT_TYPES, BenchConfig
from s2core.benchmarking.machine import HASWELL, cpu_flags

#: numba's target for --avx2 (machine.HASWELL: the name alone would keep the host's features)
HASWELL_ENV = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": HASWELL}

# The measuring libraries are the `bench` extra; say so instead of failing on an import.
REQUIRED = ("matplotlib", "psutil", "threadpoolctl")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="s2core bench",
        description="Measure every available backend on S2 Pro-shaped models: load, memory, "
                    "prefill, decode step (against the memory-bandwidth floor) and Fast-AR.")
    p.add_argument("--case", choices=("backends", "voice", "batch", "http", "e2e"),
                   default="backends",
                   help="backends: load, prefill, decode step, Fast-AR per backend (default); "
                        "voice: time to first frame with a cold prompt vs a restored voice "
                        "prefix (types default f16); batch: aggregate frames/s of 1, 2, 4 and "
                        "8 concurrent sequences through s2core.serving (types default "
                        "f16,q8_0); http: 1, 4 and 16 streaming clients over HTTP against "
                        "generate_many in process (types default q8_0); e2e: a 10-word sentence with a restored "
                        "voice and the codec in the same file, time to first audio against its "
                        "floor and compute s per audio s (types default q4_k_m, layers 36, the "
                        "backend load() picks unless --backends names some)")
    p.add_argument("--layers", type=int,
                   help="Slow-AR layers of the model (default 4; 1 with --quick)")
    p.add_argument("--types", type=_csv,
                   help=f"weight types, comma-separated (default {','.join(DEFAULT_TYPES)})")
    p.add_argument("--backends", type=_csv,
                   help="backends to measure, comma-separated (default: every available one)")
    p.add_argument("--context", type=int, help="KV cache positions before the decode steps (256)")
    p.add_argument("--sizes", type=lambda text: tuple(int(x) for x in _csv(text)),
                   help="batch case: the numbers of concurrent sequences, the first the "
                        "baseline of the speedups (default 1,2,4,8)")
    p.add_argument("--frames", type=int, default=4,
                   help="batch case: timed frames of every request per size and round (4)")
    p.add_argument("--rounds", type=int, default=3,
                   help="batch case: interleaved rounds over the sizes (3; 1 with --quick)")
    p.add_argument("--steps", type=int, help="timed decode steps after 3 warm-up steps (20)")
    p.add_argument("--prefill-tokens", type=int, help="tokens per timed prefill (256)")
    p.add_argument("--phase-budget", type=float, dest="phase_budget_s",
                   help="seconds a phase may spend repeating before it stops (120)")
    p.add_argument("--threads", type=int,
                   help="set OMP/BLAS/torch thread counts (default: the libraries' own)")
    p.add_argument("--seed", type=int, help="seed of the weights and prompts (0)")
    p.add_argument("--model-dir", type=Path,
                   help="model cache (default ~/.cache/s2core or $S2CORE_CACHE)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--avx2", action="store_true",
                   help="compile numba's kernels (the NumPy backend's) for a Haswell: the code "
                        "AVX2-only CPUs run, measured on an AVX-512 machine; files are tagged "
                        "-avx2 (needs a CPU with AVX2)")
    p.add_argument("--quick", action="store_true",
                   help="a tiny run (1-layer test-sized model, few repetitions) for tests")
    p.add_argument("--codec", action="store_true",
                   help="the codec's decode benchmark instead (see `s2core bench --codec --help`)")
    p.add_argument("--render", type=Path, metavar="JSON",
                   help="measure nothing: print the tables of an earlier run's JSON and rewrite "
                        "its PNG and markdown next to it")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    fields = dict(layers=args.layers, types=args.types, backends=args.backends,
                  context=args.context, steps=args.steps, prefill_tokens=args.prefill_tokens,
                  phase_budget_s=args.phase_budget_s, threads=args.threads, seed=args.seed,
                  model_dir=args.model_dir, out_dir=args.out)
    if args.case == "voice" and args.types is None:
        fields["types"] = ("f16",)
    if args.case == "batch" and args.types is None:
        from s2core.benchmarking.batch import DEFAULT_TYPES as BATCH_TYPES
        fields["types"] = BATCH_TYPES
    if args.case == "http" and args.types is None:
        from s2core.benchmarking.http import DEFAULT_TYPES as HTTP_TYPES
        fields["types"] = HTTP_TYPES
    if args.case == "e2e":
        from s2core.benchmarking import e2e
        if args.types is None:
            fields["types"] = e2e.DEFAULT_TYPES
        if args.layers is None and not args.quick:
            fields["layers"] = e2e.DEFAULT_LAYERS
    if args.quick:
        return BenchConfig.quick_run(**fields)
    return BenchConfig(**{k: v for k, v in fields.items() if v is not None})


def output_stem(report: dict) -> str:
    """bench-YYYYMMDD-HHMM-<machine tag>[-quick]: sorts by date, says where it ran."""
    created = dt.datetime.fromisoformat(report["created"])
    quick = "-quick" if report["config"]["quick"] else ""
    return f"bench-{created:%Y%m%d-%H%M}-{report['machine_tag']}{quick}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--codec" in argv:  # the codec's benchmark has its own options (s2core.benchmarking.codec)
        from s2core.benchmarking.codec import main as codec_main
        return codec_main(argv)
    args = build_parser().parse_args(argv)
    missing = [m for m in REQUIRED if not _importable(m)]
    if missing:
        print(f"s2core bench needs {', '.join(missing)}: pip install 's2core[bench]'", file=sys.stderr)
        return 2
    if args.render:
        return render(args.render)
    cfg = config_from_args(args)
    if cfg.steps < 1 or cfg.context < 1 or cfg.prefill_tokens < 1 or cfg.layers < 1:
        print("--steps, --context, --prefill-tokens and --layers must be positive", file=sys.stderr)
        return 2
    if args.case == "batch" and args.sizes is not None and (not args.sizes
                                                             or min(args.sizes) < 1):
        print("--sizes must be positive numbers of sequences", file=sys.stderr)
        return 2
    if args.case == "batch" and (args.frames < 1 or args.rounds < 1):
        print("--frames and --rounds must be positive", file=sys.stderr)
        return 2
    if args.avx2 and "avx2" not in cpu_flags():
        print("--avx2 builds the AVX2 code, which this CPU cannot run (no avx2 among its flags "
              f"{cpu_flags()})", file=sys.stderr)
        return 2
    with numba_target(HASWELL_ENV if args.avx2 else {}):
        return run_case(args, cfg)


@contextlib.contextmanager
def numba_target(env: dict[str, str]):
    """The environment the measuring children start with, numba's target among it, set for
    the run and put back after (main may run inside another program, a test)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, value in saved.items():
            if value is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = value


def run_case(args: argparse.Namespace, cfg: BenchConfig) -> int:
    if args.case == "voice":
        from s2core.benchmarking.voice import run_voice_benchmark, write_outputs as write_voice
        return write_voice(run_voice_benchmark(cfg, _say), cfg.out_dir)

    if args.case == "batch":
        from s2core.benchmarking.batch import run_batch_benchmark, write_outputs as write_batch
        return write_batch(run_batch_benchmark(cfg, _say, frames=args.frames,
                                               rounds=args.rounds, sizes=args.sizes),
                           cfg.out_dir)

    if args.case == "http":
        from s2core.benchmarking.http import run_http_benchmark, write_outputs as write_http
        return write_http(run_http_benchmark(cfg, _say), cfg.out_dir)

    if args.case == "e2e":
        from s2core.benchmarking.e2e import run_e2e_benchmark, write_outputs as write_e2e
        return write_e2e(run_e2e_benchmark(cfg, _say), cfg.out_dir)

    from s2core.benchmarking.runner import run_benchmark

    report = run_benchmark(cfg)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    return write_outputs(report, cfg.out_dir / output_stem(report))


def write_outputs(report: dict, stem: Path) -> int:
    """JSON, PNG and markdown at `stem`.*, the tables on stdout; 1 if any measurement failed."""
    from s2core.benchmarking.chart import write_chart
    from s2core.benchmarking.report import markdown_text, terminal_text, write_json

    paths = {k: stem.with_name(f"{stem.name}.{k}") for k in ("json", "png", "md")}
    report["outputs"] = {k: str(p) for k, p in paths.items()}
    chart_ok = any(r["status"] == "ok" for r in report["results"])
    if chart_ok:
        write_chart(report, paths["png"])
    write_json(report, paths["json"])
    paths["md"].write_text(markdown_text(report, paths["png"].name if chart_ok else None))
    print(terminal_text(report))
    print("\nwrote " + ", ".join(str(p) for k, p in paths.items() if k != "png" or chart_ok))
    failed = [r for r in report["results"] if r["status"] != "ok"]
    return 1 if failed or not report["results"] else 0


def render(json_path: Path) -> int:
    """Rewrite the tables, chart and summary of an earlier run (after changing how they look)."""
    import json

    report = json.loads(json_path.read_text())
    return write_outputs(report, json_path.with_suffix(""))


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _importable(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    sys.exit(main())
