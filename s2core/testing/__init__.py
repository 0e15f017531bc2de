"""Helpers for this repository's own tests: random quantized blocks and running the CLI in a
subprocess. (Prompts for tests and benchmarks live in `s2core.kit.prompts`, for plugin authors
too; the model and codec writers in `s2core.embedded`.)"""
