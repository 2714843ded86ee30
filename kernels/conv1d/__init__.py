"""Causal depthwise conv1d family: the `causal-conv1d` package's Python API in Helion.

fwd.py: the forward kernel and `conv1d_forward`; bwd.py: `conv1d_backward` (what the fused
Mamba-2 layer calls from its own autograd Function) and the two kernels of calls that are not
channel-last; bwd_slide.py: the one kernel of channel-last calls (the layer's);
causal_conv1d.py: `causal_conv1d_fn` (forward and backward, autograd); update.py:
`causal_conv1d_update`, the decode step; common.py: the shape contract, layouts and tiles.
Runtime records: causal_conv1d_fwd, causal_conv1d_bwd_slide, causal_conv1d_bwd and
causal_conv1d_bwd_dx, causal_conv1d_update; their tuning records are in `autotune_cli/tuning/conv1d.py`.
"""

from mamba_tune.conv1d.bwd import conv1d_backward
from mamba_tune.conv1d.causal_conv1d import causal_conv1d_fn
from mamba_tune.conv1d.fwd import conv1d_forward
from mamba_tune.conv1d.update import causal_conv1d_update

__all__ = [
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "conv1d_backward",
    "conv1d_forward",
]
