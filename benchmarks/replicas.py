#!/usr/bin/env python
"""Frames/s of the HTTP API on 1 and 2 Ray Serve replicas (s2core.cluster), and the voice
affinity, on this machine.

    python benchmarks/replicas.py [--frames 24] [--clients 1,2,4,8] [--replicas 1,2]

On a local Ray instance, for each replica count: the application with the embedded default
model (numpy backend, 4 slots a replica, 16 requests may wait in front of them), one warm-up
request per replica, then for each client count that many streaming requests at once (`pcm`,
`--frames` frames each, distinct seeds), each timed from its send to its first audio byte and to its last:
aggregate frames/s, time to first audio and request time (p50, p95). Then the affinity run
on the largest replica count: `--voices` new voices in the shared store, `--per-voice`
requests in each (the first of each alone, the rest at once); the prefix loads each replica
counted against the requests.

Every replica shares this machine's cores: on a 2-core machine two replicas have no more
arithmetic than one (each batch's BLAS calls already use both cores); what they can overlap is
one process's Python work (sampling, the codec's streaming decode, HTTP framing) with the
other's arithmetic.

Results go to benchmarks/results/replicas-<date>-<time>-<machine tag>.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np

from s2core.benchmarking import machine

#: the embedded codec's samples a frame (16-bit mono pcm: two bytes each)
SAMPLES_PER_FRAME = 2048
#: the flags that decide which SIMD kernels NumPy's BLAS and the backends use
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
              "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [flag for flag in SIMD_FLAGS if flag in have]
    except OSError:
        pass
    return []


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def clients_at_once(url: str, bodies: list[dict], bytes_per_frame: int) -> dict:
    import httpx

    async def one(client, body):
        t0 = time.perf_counter()
        first = None
        size = 0
        async with client.stream("POST", "/v1/audio/speech", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {await r.aread()!r}")
            replica = r.headers.get("x-s2core-replica")
            async for piece in r.aiter_bytes():
                if piece and first is None:
                    first = time.perf_counter() - t0
                size += len(piece)
        return {"ttfa_s": first, "total_s": time.perf_counter() - t0,
                "frames": size // bytes_per_frame, "replica": replica}

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        t0 = time.perf_counter()
        rows = await asyncio.gather(*[one(client, b) for b in bodies])
        wall = time.perf_counter() - t0
    frames = sum(r["frames"] for r in rows)
    ttfa = [r["ttfa_s"] for r in rows]
    total = [r["total_s"] for r in rows]
    return {"clients": len(bodies), "frames": frames, "wall_s": wall,
            "frames_per_s": frames / wall, "ttfa_p50_s": pct(ttfa, 50),
            "ttfa_p95_s": pct(ttfa, 95), "request_p50_s": pct(total, 50),
            "request_p95_s": pct(total, 95),
            "replicas_answering": sorted({r["replica"] for r in rows})}


def body(i: int, frames: int, voice: str = "default") -> dict:
    return {"model": "s2-pro", "input": f"Benchmark sentence {i}.", "voice": voice,
            "response_format": "pcm", "seed": i, "max_new_tokens": frames}


def describe_all(handle, want: int) -> dict:
    seen: dict = {}
    for _ in range(200):
        about = handle.describe.remote().result(timeout_s=30)
        seen[about["replica"]] = about
        if len(seen) == want:
            break
    return seen


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=24)
    p.add_argument("--clients", default="1,2,4,8")
    p.add_argument("--replicas", default="1,2")
    p.add_argument("--voices", type=int, default=6)
    p.add_argument("--per-voice", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args()
    import ray
    from ray import serve

    from s2core.cluster.ray_app import build, engine_options
    from s2core.cluster.scaling import Scaling
    from s2core.embedded.writer import demo_hparams
    from s2core.voice.file import SAMPLE_RATE, Voice
    from s2core.voice.library import VoiceLibrary

    info = machine.describe()
    info["cpu_flags"] = cpu_flags()
    hp = demo_hparams()
    bytes_per_frame = 2 * SAMPLES_PER_FRAME
    clients = [int(c) for c in args.clients.split(",")]
    replica_counts = [int(r) for r in args.replicas.split(",")]
    voices_dir = tempfile.mkdtemp(prefix="s2core-bench-voices-")
    ray.init(num_cpus=info["cpus_usable"], include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": 8397})
    url = "http://127.0.0.1:8397"
    runs, affinity = [], None
    try:
        for n in replica_counts:
            scaling = Scaling(replicas=n, max_sequences=4, max_queue=16)
            options = engine_options(None, None, voices_dir, "numpy", None, scaling)
            t = time.perf_counter()
            serve.run(build(options, scaling), name="bench", route_prefix="/")
            start_s = time.perf_counter() - t
            handle = serve.get_deployment_handle("s2core-replica", app_name="bench")
            asyncio.run(clients_at_once(url, [body(10_000 + k, 2) for k in range(2 * n)],
                                        bytes_per_frame))
            for c in clients:
                row = asyncio.run(clients_at_once(
                    url, [body(1000 * c + k, args.frames) for k in range(c)], bytes_per_frame))
                row.update(replicas=n, start_s=start_s)
                runs.append(row)
                print(f"{n} replica(s), {c} clients: {row['frames_per_s']:.1f} frames/s, "
                      f"first audio p50 {row['ttfa_p50_s']:.2f} s, request p50 "
                      f"{row['request_p50_s']:.2f} s, answered by {row['replicas_answering']}",
                      flush=True)
            if n == max(replica_counts):
                library = VoiceLibrary(voices_dir)
                rng = np.random.default_rng(11)
                names = [f"bench-voice-{k}" for k in range(args.voices)]
                for name in names:
                    codes = rng.integers(0, hp.codebook_size, (hp.num_codebooks, 24))
                    library.save(name, Voice(f"Voice {name}.", codes.astype(np.int32),
                                             SAMPLE_RATE, hp.codebook_size))
                before = describe_all(handle, n)
                asyncio.run(clients_at_once(url, [body(k, 2, v) for k, v in enumerate(names)],
                                            bytes_per_frame))
                rest = [body(100 + k, 2, v) for k, v in
                        enumerate(names * (args.per_voice - 1))]
                asyncio.run(clients_at_once(url, rest, bytes_per_frame))
                after = describe_all(handle, n)
                loads = {v: sum(a["voice_loads"].get(v, 0) - before.get(r, {}).get(
                    "voice_loads", {}).get(v, 0) for r, a in after.items()) for v in names}
                computes = {v: sum(a["voice_computes"].get(v, 0) for a in after.values())
                            for v in names}
                requests = args.voices * args.per_voice
                affinity = {"replicas": n, "voices": args.voices, "requests": requests,
                            "prefix_loads": loads, "prefix_computes": computes,
                            "hit_rate": 1 - sum(loads.values()) / requests,
                            "random_routing_expected_loads": args.voices * n * (
                                1 - (1 - 1 / n) ** args.per_voice)}
                print(f"affinity: {requests} requests in {args.voices} voices on {n} replicas:"
                      f" {sum(loads.values())} prefix loads ({sum(computes.values())} computed)"
                      f", hit rate {affinity['hit_rate']:.2f}; random routing would load "
                      f"{affinity['random_routing_expected_loads']:.1f}", flush=True)
            serve.delete("bench")
    finally:
        serve.shutdown()
        ray.shutdown()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M")
    stem = args.out / f"replicas-{stamp}-{machine.machine_tag(info)}"
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"machine": info, "frames_per_request": args.frames, "runs": runs,
              "affinity": affinity, "model": "embedded default (demo) model, numpy backend",
              "slots_per_replica": 4, "queue_in_front": 16}
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    lines = [f"# Replicas on Ray Serve, {stamp}", "", *machine.summary_lines(info),
             f"CPU flags (SIMD): {' '.join(info['cpu_flags'])}", "",
             (f"`python benchmarks/replicas.py`: the embedded default model, numpy backend, 4 "
              f"slots + 16 queued a replica, {args.frames} frames a request, streaming `pcm`."),
             ("All replicas share this machine's cores (and other sessions use them too: see "
              "the load average)."), "",
             ("| replicas | clients | frames/s | first audio p50 / p95 (s) | request p50 / p95 "
              "(s) | replicas answering |"), "|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['replicas']} | {r['clients']} | {r['frames_per_s']:.1f} | "
                     f"{r['ttfa_p50_s']:.2f} / {r['ttfa_p95_s']:.2f} | {r['request_p50_s']:.2f}"
                     f" / {r['request_p95_s']:.2f} | {len(r['replicas_answering'])} |")
    if affinity:
        lines += ["", (f"Voice affinity: {affinity['requests']} requests in "
                  f"{affinity['voices']} voices on {affinity['replicas']} replicas: "
                  f"{sum(affinity['prefix_loads'].values())} prefix loads "
                  f"({sum(affinity['prefix_computes'].values())} computed, the rest restored "
                  f"from the shared store), hit rate {affinity['hit_rate']:.2f}; random "
                  f"routing: {affinity['random_routing_expected_loads']:.1f} loads expected.")]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
