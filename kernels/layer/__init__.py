"""Whole-layer drop-ins: Mamba-2's fused path from in_proj's output to out_proj's
(`split_conv1d_scan.py`: mamba-ssm's `mamba_split_conv1d_scan_combined`), built from the
conv1d, SSD and gated-norm kernels of the other families."""

from mamba_tune.layer.split_conv1d_scan import mamba_split_conv1d_scan_combined

__all__ = ["mamba_split_conv1d_scan_combined"]
