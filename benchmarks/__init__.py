"""Benchmarks: each writes JSON (and a plot) under benchmarks/results/."""
