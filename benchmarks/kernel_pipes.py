#!/usr/bin/env python
"""What bounds each integer kernel, from its machine code: instruction counts and a pipe model.

    python benchmarks/kernel_pipes.py [--mcpu znver3] [--types q8_0,q4_k,q6_k]
    NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=<machine.HASWELL> python benchmarks/kernel_pipes.py

Each kernel of backends/s2core_numpy/simd.py (one tile-block: 16 weight rows x 256 inputs,
for one activation row and for a block of BLOCK rows) is compiled alone for numba's target,
and its machine code is read: instructions, dot instructions (VNNI vpdpbusd, AVX2
vpmaddubsw; their count is checked against rows x 4096 multiply-adds), the activation
broadcasts, and the vector instructions that read or write the stack (spills and
their reloads, or sums kept there). Then, where LLVM's
llvm-mca is installed and knows `--mcpu` (apt's `llvm` package; its own list: `llvm-mca
-mcpu=help`), its model of that CPU runs the code as a loop: cycles a tile-block, the
busiest pipe's cycles (its "block reciprocal throughput"), and the cycles the dot
instructions alone need on their pipes. The model is static (no cache misses: these are the
in-cache bounds) and only as good as LLVM's tables; it names where the time goes, the
alternated timings (kernel_rows.py, kernels_ab.py) say what a change buys.

The default model is AMD's Zen 3 (znver3): an AVX2-only CPU that users have, and the one
whose model LLVM 14 carries; run it on the Haswell build (the variables above), which is
the code such CPUs run. LLVM 14 has no Zen 4 model, so the VNNI build's numbers need
another --mcpu (an Intel one such as icelake-server, whose pipes differ). Writes
benchmarks/results/kernel-pipes-<date>-<time>-<machine tag>.json and .md with the CPU model
and flags.
"""

from __future__ import annotations

import argparse
import functools
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from kernel_rows import write_kernel_report  # noqa: E402

#: multiply-adds one dot instruction makes, by ISA (simd.isa())
DOT = {"vnni": ("vpdpbusd", 64), "avx2": ("vpmaddubsw", 32)}
#: multiply-adds of one tile-block for one activation row
TILE_BLOCK_MACS = 16 * 256


def compiled_asm(kernel) -> str:
    """The machine code of a function that runs `kernel` once (an intrinsic of simd._make)."""
    import numba
    import numpy as np

    @numba.njit
    def run_once(codes, at, x, x_at, x_step, xd, xd_at, xd_step, xs, xs_at, xs_step, out,
                 out_at):
        kernel(codes, at, x, x_at, x_step, xd, xd_at, xd_step, xs, xs_at, xs_step, out, out_at)

    def of(dtype):
        return numba.typeof(np.zeros(1, dtype))

    i64 = numba.int64
    run_once.compile((of(np.uint8), i64, of(np.int8), i64, i64, of(np.float32), i64, i64,
                      of(np.int32), i64, i64, of(np.float32), i64))
    return next(iter(run_once.inspect_asm().values()))


def function_body(asm: str) -> list[str]:
    """The instructions of the compiled function (not numba's Python wrapper), from its label
    to its first return, directives and labels left out."""
    body, inside = [], False
    for line in asm.splitlines():
        text = line.strip()
        if not inside:
            inside = text.endswith(":") and "run_once" in text and "cpython" not in text
            continue
        if not text or text.startswith((".", "#")):
            continue
        body.append(text)
        if text.startswith("ret"):
            break
    return body


def counts(body: list[str], dot: str) -> dict:
    mnemonics = [line.split()[0] for line in body]
    return {"instructions": len(body), "dots": mnemonics.count(dot),
            "broadcasts": sum(m.startswith("vpbroadcast") for m in mnemonics),
            "stack_operands": sum(m.startswith("v") and "(%rsp)" in line
                                  for m, line in zip(mnemonics, body))}


@functools.cache
def dot_rthroughput(mcpu: str, dot: str) -> float:
    """The model's reciprocal throughput of one `dot` instruction on `mcpu` (NaN if it gives
    none): the cycles a dot instruction alone takes on its pipes."""
    operands = "%ymm1, %ymm2, %ymm3" if dot == "vpmaddubsw" else "%zmm1, %zmm2, %zmm3"
    run = subprocess.run([shutil.which("llvm-mca"), f"-mcpu={mcpu}", "-iterations=1",
                          "-resource-pressure=0", "-instruction-info=1", "-"],
                         input=f"{dot} {operands}\n", capture_output=True, text=True)
    # the column after the latency
    info = re.search(rf"^\s*\d+\s+\d+\s+([\d.]+)\s.*{dot}", run.stdout, re.M)
    return float(info.group(1)) if info else float("nan")


def pipe_model(body: list[str], mcpu: str, dot: str) -> dict | str:
    """llvm-mca's figures for the body run as a loop on `mcpu`, or why there are none."""
    mca = shutil.which("llvm-mca")
    if mca is None:
        return "llvm-mca is not installed (apt-get install llvm)"
    with tempfile.NamedTemporaryFile("w", suffix=".s") as f:
        f.write("\n".join(body) + "\n")
        f.flush()
        run = subprocess.run([mca, f"-mcpu={mcpu}", "-iterations=20", f.name],
                             capture_output=True, text=True)
    if run.returncode != 0 or "not a recognized processor" in run.stderr:
        return f"llvm-mca has no model of {mcpu!r}: {run.stderr.strip()[:200]}"
    cycles = int(re.search(r"Total Cycles:\s+(\d+)", run.stdout).group(1)) / 20
    busiest = float(re.search(r"Block RThroughput:\s+([\d.]+)", run.stdout).group(1))
    return {"cycles": cycles, "busiest_pipe_cycles": busiest,
            "dot_rthroughput": dot_rthroughput(mcpu, dot)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mcpu", default="znver3")
    ap.add_argument("--types", default="q8_0,q4_k,q6_k")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)

    from s2core_numpy import simd
    isa = simd.isa()
    if isa not in DOT:
        print("numba's target has no integer kernels here", file=sys.stderr)
        return 2
    dot, macs = DOT[isa]
    results = []
    for name in args.types.split(","):
        for rows, kernel in ((1, getattr(simd, f"{name}_block")),
                             (simd.BLOCK, getattr(simd, f"{name}_blocks"))):
            body = function_body(compiled_asm(kernel))
            row = {"type": name, "rows": rows, **counts(body, dot)}
            expected = rows * TILE_BLOCK_MACS // macs
            if row["dots"] != expected:
                print(f"{name}, {rows} rows: {row['dots']} {dot} where the multiply-adds need "
                      f"{expected}: not the kernel's code", file=sys.stderr)
                return 1
            model = pipe_model(body, args.mcpu, dot)
            if isinstance(model, str):
                row["model"] = None
                row["no_model"] = model
            else:
                row["model"] = model
                row["dot_bound_cycles"] = expected * model["dot_rthroughput"]
                row["cycles_per_dot"] = model["cycles"] / expected
                row["share_of_dot_bound"] = row["dot_bound_cycles"] / model["cycles"]
            results.append(row)
            print(row, flush=True)

    lines = [f"The integer kernels' machine code ({isa} build), a tile-block (16 weight rows x "
             "256 inputs) each; the pipe model is llvm-mca's for "
             f"{args.mcpu} (the code run as a loop, in cache).", "",
             f"| type | rows | instructions | {dot} | broadcasts | stack operands | model cycles "
             f"| busiest pipe cycles | cycles a {dot} | {dot} alone on their pipes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        m = r["model"]
        modelled = (f"{m['cycles']:.0f} | {m['busiest_pipe_cycles']:.0f} | "
                    f"{r['cycles_per_dot']:.2f} | {r['share_of_dot_bound']:.0%}" if m
                    else "- | - | - | -")
        lines.append(f"| {r['type']} | {r['rows']} | {r['instructions']} | {r['dots']} | "
                     f"{r['broadcasts']} | {r['stack_operands']} | {modelled} |")
    missing = {r["no_model"] for r in results if r["model"] is None}
    lines += [""] + [f"No model: {why}" for why in sorted(missing)]
    write_kernel_report(args.out, "kernel-pipes", results, lines, mcpu=args.mcpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
