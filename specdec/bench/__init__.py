"""Benchmarks: datasets, baselines (HF transformers), side-by-side runs and reports."""
