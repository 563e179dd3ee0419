"""Benchmarks, A/B runs and profiles of the kernels, and the readers of their logs."""
