"""What a benchmark run measures: one frozen BenchConfig, built by the CLI or by tests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from s2core.modelfile.hparams import Hparams
from s2core.embedded.writer import s2pro_hparams, tiny_hparams

#: f32/f16/q8_0, and the K-quant files people download most (q4_k_m mixes Q4_K and Q6_K)
DEFAULT_TYPES = ("f32", "f16", "q8_0", "q4_k_m", "q6_k")
#: --quick's types: its test-sized rows are not whole K-quant blocks (they would fall back to
#: Q8_0/F16 as llama.cpp's quantizer does), so the K-quant files add nothing there
QUICK_TYPES = ("f32", "f16", "q8_0")
DEFAULT_OUT = Path("benchmarks") / "results"


@dataclass(frozen=True)
class BenchConfig:
    """Every knob of a run. The defaults are the standard run: 4 S2 Pro layers, 5 weight types."""

    layers: int = 4
    fast_layers: int = 4
    types: tuple[str, ...] = DEFAULT_TYPES
    #: backend names to measure; None = every available backend
    backends: tuple[str, ...] | None = None
    #: positions in the KV cache before the timed decode steps
    context: int = 256
    steps: int = 20
    warmup_steps: int = 3
    #: after the Fast-AR, decode steps each followed by one sample of the sum bandwidth: each
    #: step against the floor of its own moment (the machine's speed moves between minutes)
    beside_steps: int = 10
    prefill_tokens: int = 256
    #: timed prefills after one untimed warm-up prefill
    prefill_reps: int = 3
    #: timed Fast-AR frames (9 fast_decode calls each) after one warm-up frame
    fast_frames: int = 5
    #: a phase (prefill, decode, fast) stops repeating once it has spent this long (slow
    #: backends such as MLX on Linux CPU), keeping at least `min_reps` repetitions
    phase_budget_s: float = 120.0
    min_reps: int = 3
    #: a child (one backend, one type) is killed after this long
    child_timeout_s: float = 1800.0
    #: bandwidth: copy of `bandwidth_mb` MiB float64 into another array, best of `bandwidth_reps`
    bandwidth_mb: int = 512
    bandwidth_reps: int = 5
    seed: int = 0
    #: None = the libraries' defaults (stated in the output); N sets OMP/BLAS/torch threads
    threads: int | None = None
    quick: bool = False
    out_dir: Path = DEFAULT_OUT
    #: where models are cached; None = s2core.embedded.cache.cache_dir() (~/.cache/s2core, $S2CORE_CACHE)
    model_dir: Path | None = None
    extra_notes: tuple[str, ...] = field(default=())

    @classmethod
    def quick_run(cls, **overrides: Any) -> "BenchConfig":
        """A tiny run for tests and smoke checks: a 1-layer test-sized model, few repetitions."""
        base = dict(layers=1, fast_layers=1, context=32, steps=5, warmup_steps=2, beside_steps=2,
                    prefill_tokens=32, prefill_reps=2, fast_frames=2, phase_budget_s=10.0,
                    min_reps=2, child_timeout_s=300.0, bandwidth_mb=64, bandwidth_reps=3,
                    quick=True, types=QUICK_TYPES)
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def hparams(self) -> Hparams:
        """The model's shape: S2 Pro's real per-layer dimensions, or the test model's in --quick."""
        if self.quick:
            hp = tiny_hparams(n_layer=self.layers)
            return dataclasses.replace(hp, fast=dataclasses.replace(hp.fast, n_layer=self.fast_layers))
        return s2pro_hparams(n_layer=self.layers, fast_n_layer=self.fast_layers)

    @property
    def model_label(self) -> str:
        kind = "test-sized (tiny_hparams)" if self.quick else "S2 Pro dimensions"
        return f"{kind}, {self.layers} Slow-AR layer(s), {self.fast_layers} Fast-AR layer(s)"

    @property
    def kv_capacity(self) -> int:
        """Cache positions: the context plus every decode step, or the prefill, whichever is more."""
        return max(self.prefill_tokens,
                   self.context + self.warmup_steps + self.steps + self.beside_steps)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["out_dir"] = str(self.out_dir)
        d["model_dir"] = None if self.model_dir is None else str(self.model_dir)
        d["types"] = list(self.types)
        d["backends"] = None if self.backends is None else list(self.backends)
        d["extra_notes"] = list(self.extra_notes)
        return d
