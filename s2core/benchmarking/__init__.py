"""The s2core benchmark: how fast each backend runs the Slow-AR, and how far from the machine's limit.

A run writes (once, cached) an S2 Pro-shaped model per weight type, measures the machine's
memory bandwidth, then measures every backend on every type in a fresh subprocess (load time,
resident memory, prefill, decode step, Fast-AR frame). A decode step must stream the Slow-AR
layers' matrices and the tied logits matrix from memory, so its floor is those bytes divided
by the bandwidth; every step time is reported as a ratio to that floor.

    python -m s2core.benchmarking --quick          # a tiny run (seconds)
    python benchmarks/run.py                       # the default run (4 S2 Pro layers)

Modules, one job each:
    config     what to measure (BenchConfig, --quick's reduced settings)
    machine    CPU, RAM, library versions, BLAS and thread counts, a short machine tag
    bandwidth  memory bandwidth of this machine (large array copy)
    workload   bytes a step must read, floors, the prefill FLOP formula
    models     writing / finding the benchmark models and warming the page cache
    resident   this process's resident and peak memory
    timing     repetitions under a time cap, and their statistics
    measure    the child process: measures one backend on one model file
    runner     the parent: runs the children and derives ratios
    report     terminal tables, JSON and the markdown summary
    chart      the PNG chart
    cli        command-line options (`s2core bench ...`)
"""

from s2core.benchmarking.config import BenchConfig
from s2core.benchmarking.runner import run_benchmark

__all__ = ["BenchConfig", "run_benchmark"]
