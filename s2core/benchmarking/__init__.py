"""Benchmarks (filled by a later change)."""
