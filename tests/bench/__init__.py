"""Benchmarks: `python -m tests.bench` (make bench). Each reports ratios against a reference run in the same process."""
