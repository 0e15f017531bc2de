#!/usr/bin/env python
"""One command to check the torch backend on a CUDA machine: `python benchmarks/cuda_check.py`.

1. the conformance matrix (tests/test_conformance.py) on torch with device=cuda, once per
   compute dtype (f32, then f16), through pytest with S2CORE_TORCH_DEVICE/S2CORE_TORCH_DTYPE;
2. the worst relative errors against the float64 reference per (model, weight type, dtype);
3. which fused SDPA kernels accept the backend's attention calls (GQA, with and without a mask):
   none means torch falls back to its math kernel, which repeats K/V per query head;
4. timings of a decode step, a 256-token prefill and a Fast-AR frame on an S2 Pro-shaped f16
   model (all S2 Pro dims, --layers Slow-AR layers; written to a temp dir) for torch on the
   device in each dtype and for the NumPy backend, and the model file's pages still resident
   on the host after load (torch on CUDA copies every tensor to the GPU and releases them all:
   more than 10 % left is reported as a problem).

Prints a table, writes JSON to --out, exits non-zero on any failure. About 5 minutes on an
H200. Without a GPU, `--device cpu --layers 1` is a dry run of the same steps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A checkout that is not pip-installed still finds s2core and its built-in backends.
for _path in (ROOT, ROOT / "backends"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import numpy as np  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="torch device: cuda, cuda:N, or cpu for a "
                   "dry run (default cuda)")
    p.add_argument("--dtypes", default=None, help="compute dtypes, comma-separated (default "
                   "f32,f16 on CUDA, f32 on the CPU)")
    p.add_argument("--layers", type=int, default=4, help="Slow-AR layers of the timing model "
                   "(default 4: S2 Pro dims, ~2.6 GB in f16)")
    p.add_argument("--prefill-tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=20, help="timed decode steps per backend")
    p.add_argument("--skip-numpy", action="store_true", help="time torch only")
    p.add_argument("--skip-conformance", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cuda_check.json")
    return p.parse_args(argv)


# ---------------------------------------------------------------------- environment
def environment(device: str) -> dict:
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "numpy": np.__version__,
           "cuda_available": torch.cuda.is_available(), "device": device,
           "cpu_threads": torch.get_num_threads()}
    if device.startswith("cuda") and torch.cuda.is_available():
        dev = torch.device(device)
        props = torch.cuda.get_device_properties(dev)
        env.update(gpu=props.name, capability=f"sm_{props.major}{props.minor}",
                   gpu_memory_gb=round(props.total_memory / 2**30, 1),
                   cudnn=torch.backends.cudnn.version())
    return env


# ---------------------------------------------------------------------- 1. conformance
def run_conformance(device: str, dtype: str) -> dict:
    env = {**os.environ, "S2CORE_TORCH_DEVICE": device, "S2CORE_TORCH_DTYPE": dtype,
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "backends"),
                                          os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/test_conformance.py", "--s2core-backend", "torch"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    summary = lines[-1] if lines else ""
    failures = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    return {"dtype": dtype, "ok": proc.returncode == 0, "returncode": proc.returncode,
            "summary": summary, "failures": failures[:30],
            "seconds": round(time.perf_counter() - t0, 1),
            "tail": lines[-40:] if proc.returncode else []}


# ---------------------------------------------------------------------- 2. errors
def measure_errors(device: str, dtype: str) -> list[dict]:
    """Worst ||out - ref|| / ||ref|| per matrix entry, as the conformance tests compute them."""
    import s2core
    from s2core.kit.conformance import prompt_and_frames, rel_err
    from s2core.kit.models import MATRIX, kit_model, kit_reference
    from s2core.kit.tolerances import fast_tolerance, kv_tolerance, output_tolerance

    rows = []
    for config, weight_type in MATRIX:
        ref = kit_reference(config, weight_type)
        with s2core.load(kit_model(config, weight_type), backend="torch", device=device,
                         dtype=dtype) as m:
            prompt, frames = prompt_and_frames(config)
            m.init_kv_cache(64)
            r = m.prefill(prompt)
            expected = ref.forward(prompt)
            prefill = max(rel_err(r.hidden, expected.hidden), rel_err(r.logits, expected.logits))
            k, v = m.kv_cache_snapshot()
            kv = max(rel_err(k, expected.k), rel_err(v, expected.v))
            seq, steps = prompt, 0.0
            for frame in frames:
                r = m.step(frame)
                seq = np.vstack([seq, frame])
                e = ref.forward(seq)
                steps = max(steps, rel_err(r.hidden, e.hidden), rel_err(r.logits, e.logits))
            hp = m.hparams
            rng = np.random.default_rng(3)
            hidden = rng.standard_normal(hp.dim).astype(np.float32)
            codes = rng.integers(0, hp.codebook_size, hp.num_codebooks)
            fast = max(rel_err(m.fast_decode(hidden, codes[:n]), ref.fast_decode(hidden, codes[:n]))
                       for n in range(hp.num_codebooks))
            caps = m.capabilities
            rows.append({"model": f"{config}-{weight_type}", "dtype": dtype,
                         "compute_dtype": caps.compute_dtype, "prefill": prefill, "steps": steps,
                         "kv": kv, "fast": fast, "tol_output": output_tolerance(caps),
                         "tol_kv": kv_tolerance(caps), "tol_fast": fast_tolerance(caps)})
    return rows


# ---------------------------------------------------------------------- 3. SDPA kernels
def sdpa_kernels(device: str, dtypes: list[str]) -> list[dict]:
    """Which fused kernels take the backend's two attention shapes (S2 Pro heads)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from s2core_torch.ops import causal_mask
    from s2core_torch.options import TORCH_DTYPES

    dev = torch.device(device)
    fused = [b for b in (getattr(SDPBackend, n, None) for n in
                         ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")) if b]
    out = []
    for dtype in dtypes:
        dt = TORCH_DTYPES[dtype]
        for case, n_q, n_past in (("decode (1 query, no mask)", 1, 300),
                                  ("prefill (256 queries, bool mask)", 256, 32)):
            t = n_past + n_q
            q = torch.randn(1, 32, n_q, 128, device=dev, dtype=dt)
            k = torch.randn(1, 8, t, 128, device=dev, dtype=dt)
            mask = causal_mask(n_q, n_past, dev)
            accepted = []
            for backend in fused:
                try:
                    with sdpa_kernel([backend]):
                        F.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)
                    accepted.append(backend.name)
                except RuntimeError:
                    pass
            out.append({"dtype": dtype, "case": case, "fused_kernels": accepted})
    return out


# ---------------------------------------------------------------------- 4. timing
def time_backend(path: Path, backend: str, options: dict, n_prefill: int, n_steps: int) -> dict:
    import s2core
    from s2core.testing.prompts import mixed_prompt, semantic_frame

    device = options.get("device", "cpu")
    sync = _synchronizer(device)
    if device.startswith("cuda"):
        import torch
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    m = s2core.load(path, backend=backend, **options)
    load_s = time.perf_counter() - t0
    file_pages = _file_pages_resident(path)  # torch on CUDA releases every copied tensor's
    try:
        hp = m.hparams
        rng = np.random.default_rng(0)
        prompt = mixed_prompt(hp, n_prefill, rng)
        frames = [semantic_frame(hp, rng) for _ in range(n_steps + 2)]
        m.init_kv_cache(n_prefill + n_steps + 8)

        def timed(fn):
            sync()
            t = time.perf_counter()
            result = fn()
            _ = result.logits if hasattr(result, "logits") else result  # on the host: synced
            sync()
            return (time.perf_counter() - t) * 1e3, result

        m.prefill_fast(prompt).logits  # warm-up: kernels, page cache
        fast_ms, policy_ms = [], []
        for _ in range(2):
            m.reset()
            fast_ms.append(timed(lambda: m.prefill_fast(prompt))[0])
            m.reset()
            policy_ms.append(timed(lambda: m.prefill(prompt))[0])
        steps = []
        for frame in frames:
            ms, r = timed(lambda: m.step(frame))
            steps.append(ms)
        steps = steps[2:]  # the first steps warm up the single-position path
        codes = frames[0][1:]
        frame_ms = []
        for _ in range(3):
            sync()
            t = time.perf_counter()
            for n in range(hp.num_codebooks - 1):  # codes 1..C-1 of one frame
                m.fast_decode(r.hidden, codes[:n])
            frame_ms.append((time.perf_counter() - t) * 1e3)
        caps = m.capabilities
        # What a decode step must stream: the Slow-AR layers and the tied output matrix.
        step_bytes = sum(t.n_bytes for t in m.model_file.model_tensors()
                         if t.name.startswith("layers.") or t.name == "embeddings.weight")
        row = {"backend": backend, "options": options, "compute_dtype": caps.compute_dtype,
               "kv_cache_dtype": caps.kv_cache_dtype, "load_s": round(load_s, 2),
               "prefill_fast_ms": min(fast_ms), "prefill_ms": min(policy_ms),
               "step_median_ms": float(np.median(steps)), "step_min_ms": float(np.min(steps)),
               "fast_frame_ms": float(np.median(frame_ms)),
               "step_weights_gb": round(step_bytes / 1e9, 3),
               "step_weights_gbps": round(step_bytes / 1e6 / float(np.median(steps)), 1),
               "file_gb": round(m.model_file.weight_bytes / 1e9, 3),
               "file_pages_after_load_gb": None if file_pages is None else round(file_pages / 1e9, 3)}
        row.update(_device_memory(device))
        return row
    finally:
        m.close()


def _file_pages_resident(path: Path) -> int | None:
    """Bytes of `path` resident in this process's memory maps (None without psutil)."""
    try:
        import psutil
    except ImportError:
        return None
    real = os.path.realpath(path)
    return sum(r.rss for r in psutil.Process().memory_maps(grouped=True)
               if os.path.realpath(r.path) == real)


def _synchronizer(device: str):
    if device.startswith("cuda"):
        import torch
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _device_memory(device: str) -> dict:
    if not device.startswith("cuda"):
        return {}
    import torch
    return {"cuda_max_allocated_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)}


# ---------------------------------------------------------------------- report
def print_report(result: dict) -> None:
    print("\n== environment")
    for k, v in result["environment"].items():
        print(f"  {k}: {v}")
    if result["conformance"]:
        print("\n== conformance (tests/test_conformance.py on torch)")
        for c in result["conformance"]:
            print(f"  dtype={c['dtype']}: {'PASS' if c['ok'] else 'FAIL'}  {c['summary']}  "
                  f"({c['seconds']} s)")
            for f in c["failures"]:
                print(f"    {f}")
    if result["errors"]:
        print("\n== worst relative errors vs the float64 reference (bounds in brackets)")
        print(f"  {'model':20s} {'dtype':5s} {'prefill':>9s} {'steps':>9s} {'kv':>9s} "
              f"{'fast':>9s}   [out / kv / fast]")
        for e in result["errors"]:
            print(f"  {e['model']:20s} {e['compute_dtype']:5s} {e['prefill']:9.2e} "
                  f"{e['steps']:9.2e} {e['kv']:9.2e} {e['fast']:9.2e}   "
                  f"[{e['tol_output']:.0e} / {e['tol_kv']:.0e} / {e['tol_fast']:.0e}]")
    if result["sdpa"]:
        print("\n== fused SDPA kernels accepting the backend's attention (GQA 32/8, head_dim 128)")
        for s in result["sdpa"]:
            kernels = ", ".join(s["fused_kernels"]) or "NONE (math fallback: repeats K/V)"
            print(f"  {s['dtype']:4s} {s['case']:34s} {kernels}")
    if result["timing"]:
        print(f"\n== timing, {result['timing_model']}")
        print(f"  {'backend':28s} {'compute':7s} {'load s':>7s} {'prefill ms':>11s} "
              f"{'(chunked)':>10s} {'step ms':>8s} {'(min)':>7s} {'GB/s':>6s} "
              f"{'FastAR frame ms':>16s} {'file pages GB':>14s}")
        for t in result["timing"]:
            name = t["backend"] + "".join(f" {k}={v}" for k, v in t["options"].items())
            print(f"  {name:28s} {t['compute_dtype']:7s} {t['load_s']:7.1f} "
                  f"{t['prefill_fast_ms']:11.1f} {t['prefill_ms']:10.1f} "
                  f"{t['step_median_ms']:8.2f} {t['step_min_ms']:7.2f} "
                  f"{t['step_weights_gbps']:6.0f} {t['fast_frame_ms']:16.1f} "
                  f"{_gb_or_dash(t['file_pages_after_load_gb']):>14s}")
    for problem in result["problems"]:
        print(f"\nPROBLEM: {problem}")
    print(f"\n{'OK' if result['ok'] else 'FAILED'}")


def _gb_or_dash(gb: float | None) -> str:
    return "-" if gb is None else f"{gb:.3f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    on_cuda = args.device.startswith("cuda")
    dtypes = args.dtypes.split(",") if args.dtypes else (["f32", "f16"] if on_cuda else ["f32"])
    result = {"environment": {}, "conformance": [], "errors": [], "sdpa": [], "timing": [],
              "timing_model": "", "problems": [], "ok": False}

    def attempt(what: str, fn):
        try:
            return fn()
        except Exception as exc:  # recorded, reported, and the exit status says so
            result["problems"].append(f"{what}: {exc!r}")
            traceback.print_exc()
            return None

    started = time.perf_counter()
    result["environment"] = attempt("environment", lambda: environment(args.device)) or {}
    if on_cuda and not result["environment"].get("cuda_available"):
        result["problems"].append(f"--device {args.device}: torch sees no CUDA device")
    else:
        if not args.skip_conformance:
            for dtype in dtypes:
                print(f"conformance, dtype={dtype} ...", flush=True)
                c = attempt(f"conformance {dtype}", lambda: run_conformance(args.device, dtype))
                if c:
                    result["conformance"].append(c)
                    if not c["ok"]:
                        result["problems"].append(f"conformance failed for dtype={dtype}: "
                                                  f"{c['summary']}")
        for dtype in dtypes:
            print(f"errors vs reference, dtype={dtype} ...", flush=True)
            result["errors"] += attempt(f"errors {dtype}",
                                        lambda: measure_errors(args.device, dtype)) or []
        result["sdpa"] = attempt("sdpa kernels", lambda: sdpa_kernels(args.device, dtypes)) or []
        attempt("timing", lambda: run_timing(args, dtypes, result))
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["ok"] = not result["problems"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print_report(result)
    print(f"JSON: {args.out}  ({result['seconds']} s)")
    return 0 if result["ok"] else 1


def run_timing(args: argparse.Namespace, dtypes: list[str], result: dict) -> None:
    from s2core.embedded.writer import s2pro_hparams, write_model

    hp = s2pro_hparams(n_layer=args.layers)
    with tempfile.TemporaryDirectory(prefix="s2core-cuda-check-") as tmp:
        path = Path(tmp) / f"s2pro-{args.layers}L-f16.gguf"
        print(f"writing {path.name} ...", flush=True)
        t0 = time.perf_counter()
        write_model(path, hp, "f16")
        result["timing_model"] = (f"S2 Pro dims, {args.layers} Slow-AR layers, f16, "
                                  f"{path.stat().st_size / 1e9:.2f} GB (written in "
                                  f"{time.perf_counter() - t0:.0f} s); {args.prefill_tokens}-token "
                                  "prefill; decode step includes the logits on the host; GB/s = "
                                  "stored Slow-AR + output weights per step / median step")
        runs = [("torch", {"device": args.device, "dtype": d}) for d in dtypes]
        if not args.skip_numpy:
            runs.append(("numpy", {}))
        for backend, options in runs:
            print(f"timing {backend} {options} ...", flush=True)
            try:
                row = time_backend(path, backend, options, args.prefill_tokens, args.steps)
            except Exception as exc:  # the other backends still get timed
                result["problems"].append(f"timing {backend} {options}: {exc!r}")
                traceback.print_exc()
                continue
            result["timing"].append(row)
            held = row.get("file_pages_after_load_gb")
            if backend == "torch" and args.device.startswith("cuda") and held is not None \
                    and held > 0.1 * row["file_gb"]:
                result["problems"].append(
                    f"torch {options}: {held} GB of the file's pages still resident on the host "
                    "after load (every tensor is copied to the GPU, so all should be released)")


if __name__ == "__main__":
    sys.exit(main())
