#!/usr/bin/env python
"""One command to check the torch backend on a CUDA machine: `python benchmarks/cuda_check.py`.

1. the conformance matrix (tests/test_conformance.py) on torch with device=cuda, once per
   compute dtype (f32, then f16) with quantized weights kept as stored (the CUDA default), and
   once in f32 with them widened, through pytest with S2CORE_TORCH_DEVICE/S2CORE_TORCH_DTYPE/
   S2CORE_TORCH_QUANTIZED;
2. the worst relative errors against the float64 reference per (model, weight type, dtype),
   q4_k_m / q5_k_m (mixed) files included;
3. the compiled Triton kernels (triton_kernels.py; the tests run them only interpreted) per
   GGUF type against gguf's dequantization: dequantize_into bit for bit (mismatches counted),
   the fused GEMV at 1 and 4 rows against a float64 product, and the GEMV's time on a
   9728 x 2560 matrix as GB/s of blocks read against the device's copy bandwidth;
4. which fused SDPA kernels accept the backend's attention calls (GQA, with and without a mask):
   none means torch falls back to its math kernel, which repeats K/V per query head;
5. timings of a decode step, a 256-token prefill and a Fast-AR frame on S2 Pro-shaped models
   (all S2 Pro dims, --layers Slow-AR layers; written to a temp dir): f16, and q4_k_m (Q4_K
   with Q6_K tensors; random valid blocks, since quantizing takes minutes a layer) kept as
   stored and widened; for torch on the device in each dtype and for the NumPy backend. Per
   run: the weights held on the device against the file and against the capabilities'
   estimate, the step against its floor (the bytes a step reads / the copy bandwidth measured
   in the same run), and the model file's pages still resident on the host after load (torch
   on CUDA copies every tensor to the GPU and releases them all: more than 10 % left is
   reported as a problem).

6. s2.cpp's arithmetic (`arithmetic="ggml"`, triton_ggml.py) compiled: the activation codes
   per dot type against the kit's transcription of ggml (mismatches counted), the integer
   block dots of Q8_0, Q4_K and Q6_K weights at 1 and 4 rows against the kit's float64
   product, the one-row integer product's time over the 155776 x 2560 table beside the float
   GEMV's; the kit's arithmetic rule for torch (tests/test_conformance.py -k arithmetic: on
   CUDA torch declares "ggml"); and step 5's timings again with arithmetic="ggml" (dtype f32).

Prints a table, writes JSON to --out, exits non-zero on any failure. Estimated at 7-10
minutes on an H200 (not yet run on a GPU; the CPU dry run below takes 11 minutes here). Without a GPU, `--device cpu --layers 1` is a dry run of the same steps (the Triton
kernels then run under the interpreter in a child process, on small matrices).
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
    p.add_argument("--kernels-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ggml-only", action="store_true", help=argparse.SUPPRESS)
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
def run_conformance(device: str, dtype: str, quantized: str,
                    pytest_args: list[str] | None = None) -> dict:
    env = {**os.environ, "S2CORE_TORCH_DEVICE": device, "S2CORE_TORCH_DTYPE": dtype,
           "S2CORE_TORCH_QUANTIZED": quantized,
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "backends"),
                                          os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/test_conformance.py", "--s2core-backend", "torch", *(pytest_args or [])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    summary = lines[-1] if lines else ""
    failures = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    return {"dtype": dtype, "quantized": quantized, "ok": proc.returncode == 0,
            "returncode": proc.returncode,
            "summary": summary, "failures": failures[:30],
            "seconds": round(time.perf_counter() - t0, 1),
            "tail": lines[-40:] if proc.returncode else []}


def run_arithmetic_rule(device: str) -> dict:
    """The kit's rule each-declared-arithmetic-matches-its-reference on torch in f32 with
    quantized weights kept as stored, where torch declares "ggml" on CUDA."""
    c = run_conformance(device, "f32", "stored", ["-k", "arithmetic", "-rs"])
    c["what"] = "kit arithmetic rule"
    return c


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
                         "quantized": m.backend.options.quantized,
                         "compute_dtype": caps.compute_dtype, "prefill": prefill, "steps": steps,
                         "kv": kv, "fast": fast, "tol_output": output_tolerance(caps),
                         "tol_kv": kv_tolerance(caps), "tol_fast": fast_tolerance(caps)})
    return rows


# ---------------------------------------------------------------------- 3. Triton kernels
def copy_bandwidth(device: str, nbytes: int = 1 << 29) -> float:
    """GB/s of a device-to-device copy (bytes read + written), the best of 10."""
    import torch
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    sync = _synchronizer(device)
    best = float("inf")
    for _ in range(10):
        sync()
        t = time.perf_counter()
        b.copy_(a)
        sync()
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best / 1e9


def kernel_check(device: str) -> list[dict]:
    """Compiled on CUDA; on the CPU interpreted, in a child process (Triton reads
    TRITON_INTERPRET when imported) on small matrices."""
    if device.startswith("cuda"):
        return kernel_rows(device, rows=2048, cols=2560, timed=True)
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "backends"),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, __file__, "--kernels-child"], capture_output=True,
                          text=True, env=env, timeout=600)
    if proc.returncode:
        raise RuntimeError(f"kernel check child failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["kernels"]


def ggml_kernel_check(device: str) -> list[dict]:
    """triton_ggml.py compiled on CUDA; on the CPU interpreted, in a child process."""
    if device.startswith("cuda"):
        return ggml_kernel_rows(device, rows=64, cols=2560, timed=True)
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "backends"),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, __file__, "--kernels-child", "--ggml-only"],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode:
        raise RuntimeError(f"ggml kernel check child failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["ggml_kernels"]


def ggml_kernel_rows(device: str, rows: int, cols: int, timed: bool) -> list[dict]:
    """Codes per dot type against the kit's block-by-block transcription; integer dots
    against the kit's float64 product; the one-row product's time on a large table."""
    import gguf
    import torch
    from s2core.gguf.blocks import block_shape, random_blocks
    from s2core.kit import ggml_arithmetic as kit_ggml
    from s2core_torch import triton_ggml as tg
    from s2core_torch import triton_kernels as tk

    dev = torch.device(device)
    sync = _synchronizer(device)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((rows, cols)) * rng.uniform(1e-3, 30, (rows, 1))).astype(np.float32)
    x[0, :32] = np.r_[127, np.arange(31) - 15.5]  # exact ties: rint(k + 0.5) to even
    out = []
    for dot_type, quantize_block in (("q8_0", kit_ggml.quantize_q8_0_block),
                                     ("q8_k", kit_ggml.quantize_q8_k_block)):
        codes, d = tg.quantize(dot_type, torch.from_numpy(x).to(dev))
        codes, d = codes.cpu().numpy(), tg.dot_scales(dot_type, d).cpu().numpy()
        size = tg.BLOCK_VALUES[dot_type]
        code_miss = d_miss = 0
        for r in range(rows):
            for b in range(0, cols, size):
                expected = quantize_block(x[r, b:b + size])
                code_miss += int((codes[r, b:b + size] != expected[0]).sum())
                d_miss += int(d[r, b // size] != np.float32(expected[1]))
        out.append({"what": f"{dot_type} codes", "code_mismatches": code_miss,
                    "d_mismatches": d_miss})
    for qtype in sorted(tg.INTEGER_TYPES, key=lambda t: t.name):
        values, _ = block_shape(qtype)
        raw = random_blocks(qtype, 256, cols // values, seed=int(qtype), scale=3e-5)
        w = gguf.quants.dequantize(raw, qtype).astype(np.float64)
        blocks = torch.from_numpy(raw).to(dev)
        errs = []
        for m in (1, 4):
            got = tg.int_dot(torch.from_numpy(x[:m]).to(dev), blocks, qtype).cpu().double()
            exact = torch.from_numpy(kit_ggml.ggml_product(x[:m].astype(np.float64), w, qtype))
            errs.append(float((got - exact).norm() / exact.norm()))
        row = {"what": f"{qtype.name} integer dots", "type": qtype.name,
               "int_dot_rel_err": max(errs)}
        if timed:  # the same table as the float GEMV's timing
            big = torch.from_numpy(random_blocks(qtype, 155776, cols // values, seed=1,
                                                 scale=3e-5)).to(dev)
            one = torch.randn(1, cols, device=dev)
            for name, fn in (("int_dot", lambda: tg.int_dot(one, big, qtype)),
                             ("qmv", lambda: tk.qmv(one, big, qtype, torch.float32))):
                for _ in range(3):
                    fn()
                times = []
                for _ in range(20):
                    sync()
                    t = time.perf_counter()
                    fn()
                    sync()
                    times.append(time.perf_counter() - t)
                ms = float(np.median(times)) * 1e3
                row[f"{name}_ms"] = ms
                row[f"{name}_gbps"] = big.numel() / ms / 1e6
            del big
        out.append(row)
    return out


def kernel_rows(device: str, rows: int, cols: int, timed: bool) -> list[dict]:
    import gguf
    import torch
    from s2core.gguf.blocks import block_shape, random_blocks
    from s2core_torch import triton_kernels as tk

    dev = torch.device(device)
    sync = _synchronizer(device)
    bandwidth = copy_bandwidth(device) if timed else None
    out = []
    for qtype in sorted(tk.SUPPORTED_TYPES, key=lambda t: t.name):
        values, _ = block_shape(qtype)
        raw = random_blocks(qtype, rows, cols // values, seed=int(qtype), scale=3e-5)
        expected = gguf.quants.dequantize(raw, qtype)
        blocks = torch.from_numpy(raw).to(dev)
        got = torch.empty(expected.shape, dtype=torch.float32, device=dev)
        tk.dequantize_into(blocks, qtype, got)
        got = got.cpu().numpy()
        row = {"type": qtype.name, "dequantize_mismatches": int((got != expected).sum()),
               "dequantize_max_abs_diff": float(np.abs(got - expected).max())}
        errs = []
        for m in (1, 4):
            x = torch.randn(m, cols)
            y = tk.qmv(x.to(dev), blocks, qtype, torch.float32).cpu().double()
            exact = x.double() @ torch.from_numpy(expected).double().T
            errs.append(float((y - exact).norm() / exact.norm()))
        row["qmv_rel_err"] = max(errs)
        if timed:  # a table larger than any cache: the GEMV streams it from device memory
            big = torch.from_numpy(random_blocks(qtype, 155776, cols // values, seed=1,
                                                 scale=3e-5)).to(dev)
            x = torch.randn(1, cols, device=dev)
            for _ in range(3):
                tk.qmv(x, big, qtype, torch.float32)
            times = []
            for _ in range(20):
                sync()
                t = time.perf_counter()
                tk.qmv(x, big, qtype, torch.float32)
                sync()
                times.append(time.perf_counter() - t)
            ms = float(np.median(times)) * 1e3
            row.update(qmv_ms=ms, qmv_gbps=big.numel() / ms / 1e6,
                       qmv_x_copy_floor=ms / (big.numel() / bandwidth / 1e6))
            del big
        out.append(row)
    return out


# ---------------------------------------------------------------------- 4. SDPA kernels
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


# ---------------------------------------------------------------------- 5. timing
def time_backend(path: Path, backend: str, options: dict, n_prefill: int, n_steps: int,
                 bandwidth_gbps: float | None = None) -> dict:
    import s2core
    from s2core.runtime.memory import DTYPE_BYTES, resident_weight_bytes
    from s2core.kit.prompts import mixed_prompt, semantic_frame

    device = options.get("device", "cpu")
    sync = _synchronizer(device)
    allocated_before = 0
    if device.startswith("cuda"):
        import torch
        torch.cuda.reset_peak_memory_stats(device)
        allocated_before = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    m = s2core.load(path, backend=backend, **options)
    load_s = time.perf_counter() - t0
    held_on_device = None
    if device.startswith("cuda"):
        held_on_device = torch.cuda.memory_allocated(device) - allocated_before
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
        # What a decode step must stream: the Slow-AR layers and the tied output matrix, as the
        # backend holds them (declared: stored bytes, or widened ones).
        step_tensors = [t for t in m.model_file.model_tensors()
                        if t.name.startswith("layers.") or t.name == "embeddings.weight"]
        step_bytes = sum(t.n_bytes for t in step_tensors)
        held_step_bytes = sum(
            t.n_bytes * caps.held_bytes_per_file_byte(t.type_name)
            if caps.keeps_native(t.type_name)
            else t.n_elements * DTYPE_BYTES[caps.widened_weight_dtype] for t in step_tensors)
        step_ms = float(np.median(steps))
        floor_ms = held_step_bytes / bandwidth_gbps / 1e6 if bandwidth_gbps else None
        row = {"backend": backend, "options": options, "compute_dtype": caps.compute_dtype,
               "arithmetic": caps.arithmetic,
               "kv_cache_dtype": caps.kv_cache_dtype, "load_s": round(load_s, 2),
               "prefill_fast_ms": min(fast_ms), "prefill_ms": min(policy_ms),
               "step_median_ms": float(np.median(steps)), "step_min_ms": float(np.min(steps)),
               "fast_frame_ms": float(np.median(frame_ms)),
               "step_weights_gb": round(step_bytes / 1e9, 3),
               "step_weights_gbps": round(step_bytes / 1e6 / step_ms, 1),
               "step_held_gb": round(held_step_bytes / 1e9, 3),
               "step_floor_ms": floor_ms,
               "step_x_floor": None if floor_ms is None else round(step_ms / floor_ms, 2),
               "file_gb": round(m.model_file.weight_bytes / 1e9, 3),
               "declared_weights_gb": round(resident_weight_bytes(m.model_file, caps) / 1e9, 3),
               "device_weights_gb": None if held_on_device is None
               else round(held_on_device / 1e9, 3),
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
            print(f"  dtype={c['dtype']} quantized={c['quantized']}: "
                  f"{'PASS' if c['ok'] else 'FAIL'}  {c['summary']}  "
                  f"({c['seconds']} s)")
            for f in c["failures"]:
                print(f"    {f}")
    if result["errors"]:
        print("\n== worst relative errors vs the float64 reference (bounds in brackets)")
        print(f"  {'model':20s} {'dtype':5s} {'quant.':6s} {'prefill':>9s} {'steps':>9s} {'kv':>9s} "
              f"{'fast':>9s}   [out / kv / fast]")
        for e in result["errors"]:
            print(f"  {e['model']:20s} {e['compute_dtype']:5s} {e['quantized'][:6]:6s} "
                  f"{e['prefill']:9.2e} "
                  f"{e['steps']:9.2e} {e['kv']:9.2e} {e['fast']:9.2e}   "
                  f"[{e['tol_output']:.0e} / {e['tol_kv']:.0e} / {e['tol_fast']:.0e}]")
    if result["kernels"]:
        print("\n== Triton kernels vs gguf (dequantize mismatches, GEMV rel. error; GEMV over a "
              "155776 x 2560 table)")
        for k in result["kernels"]:
            timing = (f"  {k['qmv_ms']:.3f} ms  {k['qmv_gbps']:.0f} GB/s  "
                      f"{k['qmv_x_copy_floor']:.2f}x floor" if "qmv_ms" in k else "")
            print(f"  {k['type']:5s} mismatches {k['dequantize_mismatches']:6d}  "
                  f"qmv {k['qmv_rel_err']:.1e}{timing}")
    if result["ggml_kernels"]:
        print("\n== arithmetic='ggml' (triton_ggml.py) vs the kit's transcription of ggml; "
              "one-row products over a 155776 x 2560 table")
        for k in result["ggml_kernels"]:
            if "code_mismatches" in k:
                print(f"  {k['what']:20s} code mismatches {k['code_mismatches']}, "
                      f"d mismatches {k['d_mismatches']}")
                continue
            timing = (f"  int_dot {k['int_dot_ms']:.3f} ms {k['int_dot_gbps']:.0f} GB/s, "
                      f"float qmv {k['qmv_ms']:.3f} ms" if "int_dot_ms" in k else "")
            print(f"  {k['what']:20s} rel. err {k['int_dot_rel_err']:.1e}{timing}")
    rule = result.get("arithmetic_rule")
    if rule:
        print(f"\n== the kit's arithmetic rule on torch (f32, stored): "
              f"{'PASS' if rule['ok'] else 'FAIL'}  {rule['summary']}")
        for f in rule["failures"]:
            print(f"    {f}")
    if result["sdpa"]:
        print("\n== fused SDPA kernels accepting the backend's attention (GQA 32/8, head_dim 128)")
        for s in result["sdpa"]:
            kernels = ", ".join(s["fused_kernels"]) or "NONE (math fallback: repeats K/V)"
            print(f"  {s['dtype']:4s} {s['case']:34s} {kernels}")
    if result["timing"]:
        print(f"\n== timing, {result['timing_model']}")
        print(f"  {'file':6s} {'backend':44s} {'compute':7s} {'load s':>7s} {'prefill ms':>11s} "
              f"{'(chunked)':>10s} {'step ms':>8s} {'(min)':>7s} {'GB/s':>6s} {'x floor':>7s} "
              f"{'FastAR frame ms':>16s} {'held GB':>8s} {'(declared)':>10s} {'file GB':>8s} "
              f"{'file pages GB':>14s}")
        for t in result["timing"]:
            name = t["backend"] + "".join(f" {k}={v}" for k, v in t["options"].items())
            x_floor = "-" if t["step_x_floor"] is None else f"{t['step_x_floor']:.2f}"
            print(f"  {t['weight_type']:6s} {name:44s} {t['compute_dtype']:7s} {t['load_s']:7.1f} "
                  f"{t['prefill_fast_ms']:11.1f} {t['prefill_ms']:10.1f} "
                  f"{t['step_median_ms']:8.2f} {t['step_min_ms']:7.2f} "
                  f"{t['step_weights_gbps']:6.0f} {x_floor:>7s} {t['fast_frame_ms']:16.1f} "
                  f"{_gb_or_dash(t['device_weights_gb']):>8s} {t['declared_weights_gb']:10.3f} "
                  f"{t['file_gb']:8.3f} {_gb_or_dash(t['file_pages_after_load_gb']):>14s}")
    for problem in result["problems"]:
        print(f"\nPROBLEM: {problem}")
    print(f"\n{'OK' if result['ok'] else 'FAILED'}")


def _gb_or_dash(gb: float | None) -> str:
    return "-" if gb is None else f"{gb:.3f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    on_cuda = args.device.startswith("cuda")
    dtypes = args.dtypes.split(",") if args.dtypes else (["f32", "f16"] if on_cuda else ["f32"])
    if args.kernels_child:  # the CPU dry run's interpreted kernels (see kernel_check)
        print(json.dumps({"kernels": [] if args.ggml_only
                          else kernel_rows("cpu", rows=64, cols=512, timed=False),
                          "ggml_kernels": ggml_kernel_rows("cpu", rows=8, cols=512,
                                                           timed=False)}))
        return 0
    result = {"environment": {}, "conformance": [], "errors": [], "kernels": [], "sdpa": [],
              "ggml_kernels": [], "arithmetic_rule": None, "timing": [], "timing_model": "",
              "bandwidth_gbps": None, "problems": [], "ok": False}

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
            runs = [(dtype, "stored") for dtype in dtypes] + [(dtypes[0], "widen")]
            for dtype, quantized in runs:
                print(f"conformance, dtype={dtype}, quantized={quantized} ...", flush=True)
                c = attempt(f"conformance {dtype} {quantized}",
                            lambda: run_conformance(args.device, dtype, quantized))
                if c:
                    result["conformance"].append(c)
                    if not c["ok"]:
                        result["problems"].append(f"conformance failed for dtype={dtype}, "
                                                  f"quantized={quantized}: {c['summary']}")
        for dtype in dtypes:
            print(f"errors vs reference, dtype={dtype} ...", flush=True)
            result["errors"] += attempt(f"errors {dtype}",
                                        lambda: measure_errors(args.device, dtype)) or []
        print("Triton kernels vs gguf ...", flush=True)
        result["kernels"] = attempt("triton kernels", lambda: kernel_check(args.device)) or []
        for k in result["kernels"]:
            if k["dequantize_mismatches"] or k["qmv_rel_err"] > 1e-5:
                result["problems"].append(f"Triton kernels, {k['type']}: {k}")
        print("arithmetic='ggml' kernels vs the kit's ggml transcription ...", flush=True)
        result["ggml_kernels"] = attempt("ggml kernels",
                                         lambda: ggml_kernel_check(args.device)) or []
        for k in result["ggml_kernels"]:
            if k.get("code_mismatches") or k.get("d_mismatches") \
                    or k.get("int_dot_rel_err", 0) > 1e-6:
                result["problems"].append(f"arithmetic='ggml' kernels, {k['what']}: {k}")
        if not args.skip_conformance:
            print("the kit's arithmetic rule on torch ...", flush=True)
            rule = attempt("arithmetic rule", lambda: run_arithmetic_rule(args.device))
            result["arithmetic_rule"] = rule
            if rule and not rule["ok"]:
                result["problems"].append(f"the kit's arithmetic rule failed: {rule['summary']}")
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
    on_cuda = args.device.startswith("cuda")
    bandwidth = copy_bandwidth(args.device)
    result["bandwidth_gbps"] = round(bandwidth, 1)
    with tempfile.TemporaryDirectory(prefix="s2core-cuda-check-") as tmp:
        models = []
        for weight_type in ("f16", "q4_k_m"):
            path = Path(tmp) / f"s2pro-{args.layers}L-{weight_type}.gguf"
            print(f"writing {path.name} ...", flush=True)
            t0 = time.perf_counter()
            write_model(path, hp, weight_type, random_blocks=True)
            models.append((weight_type, path, time.perf_counter() - t0))
        result["timing_model"] = (
            f"S2 Pro dims, {args.layers} Slow-AR layers: "
            + ", ".join(f"{w} {p.stat().st_size / 1e9:.2f} GB (written in {s:.0f} s)"
                        for w, p, s in models)
            + f"; {args.prefill_tokens}-token prefill; decode step includes the logits on the "
            "host; GB/s = stored Slow-AR + output weights per step / median step; x floor = "
            f"median step / (held step bytes / {bandwidth:.0f} GB/s, a copy's bandwidth); "
            "q4_k_m holds random valid blocks (timing only)")
        for weight_type, path, _ in models:
            runs = [("torch", {"device": args.device, "dtype": d}) for d in dtypes]
            if weight_type != "f16":  # kept as stored (CUDA's default), and widened as before
                runs = [("torch", {**o, "quantized": "stored"}) for _, o in runs]
                runs.append(("torch", {"device": args.device, "dtype": dtypes[-1],
                                       "quantized": "widen"}))
            if on_cuda and "f32" in dtypes:  # s2.cpp's arithmetic beside the f32 runs
                runs.append(("torch", {"device": args.device, "dtype": "f32",
                                       "arithmetic": "ggml"}))
            if not args.skip_numpy:
                runs.append(("numpy", {}))
            for backend, options in runs:
                print(f"timing {weight_type} {backend} {options} ...", flush=True)
                try:
                    row = time_backend(path, backend, options, args.prefill_tokens, args.steps,
                                       bandwidth)
                except Exception as exc:  # the other backends still get timed
                    result["problems"].append(f"timing {weight_type} {backend} {options}: "
                                              f"{exc!r}")
                    traceback.print_exc()
                    continue
                row["weight_type"] = weight_type
                result["timing"].append(row)
                held = row.get("file_pages_after_load_gb")
                if backend == "torch" and on_cuda and held is not None \
                        and held > 0.1 * row["file_gb"]:
                    result["problems"].append(
                        f"torch {options}: {held} GB of the file's pages still resident on the "
                        "host after load (every tensor is copied to the GPU, so all should be "
                        "released)")
                device_gb = row.get("device_weights_gb")
                if device_gb is not None and device_gb > 1.15 * row["declared_weights_gb"] + 0.3:
                    result["problems"].append(
                        f"{weight_type} torch {options}: {device_gb} GB on the device after load, "
                        f"declared {row['declared_weights_gb']} GB")


if __name__ == "__main__":
    sys.exit(main())
