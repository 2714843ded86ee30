"""Benchmarks against named baselines (mamba-ssm, eager PyTorch), run by `mamba-tune bench`."""
