"""Stability reports and benchmarks."""
