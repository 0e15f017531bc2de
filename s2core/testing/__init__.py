"""Helpers for this repository's own tests: running the CLI in a subprocess. (Prompts and
random quantized blocks for tests and benchmarks live in `s2core.kit`, for plugin authors too;
the model and codec writers in `s2core.embedded`.)"""
