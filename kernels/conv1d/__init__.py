"""Causal depthwise conv1d family: the `causal-conv1d` package's Python API in Helion.

causal_conv1d.py: `causal_conv1d_fn` (forward and backward, autograd) and the explicit
`conv1d_forward` / `conv1d_backward` that the fused Mamba-2 layer calls from its own
autograd Function; update.py: `causal_conv1d_update`, the decode step. Runtime records:
causal_conv1d_fwd, causal_conv1d_bwd and causal_conv1d_bwd_dx (the backward's two kernels),
causal_conv1d_update; their tuning records are in
`autotune_cli/tuning/conv1d.py`.
"""

from mamba_tune.conv1d.causal_conv1d import causal_conv1d_fn, conv1d_backward, conv1d_forward
from mamba_tune.conv1d.update import causal_conv1d_update

__all__ = [
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "conv1d_backward",
    "conv1d_forward",
]
