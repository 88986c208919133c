"""Benchmarks: drapps.Loader side by side with torch's DataLoader on real pipelines."""

from drapps.bench.data import make_jpeg_folder
from drapps.bench.runner import BenchConfig, run_benchmark

__all__ = ["BenchConfig", "make_jpeg_folder", "run_benchmark"]
