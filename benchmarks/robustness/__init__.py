"""`python -m benchmarks.robustness`: the project's stress suite (docs/robustness.md)."""
