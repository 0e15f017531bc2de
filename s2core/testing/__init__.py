"""Inputs for tests and benchmarks: prompts that mix text and semantic positions.

The model and codec writers live in `s2core.embedded` (the demo uses them too)."""
