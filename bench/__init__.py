"""Benchmarks: run with `make bench` (or `python -m bench ...`); each reports ratios to a reference run alongside."""
