"""Mamba-2 SSD family: mamba-ssm's `mamba_chunk_scan_combined` forward and backward, one file per stage.

chunk_cumsum (F1) -> chunk_state_passing (F2 + F3: the chunk states and their passing, walking
the chunks in order) -> bmm (F4) -> chunk_scan (F5); combined.py chains them and holds the
autograd Function, whose backward runs chunk_state_passing_bwd (B2+B3; or chunk_state (F2's
kernel alone) then state_passing_bwd, at the shapes where that is faster) -> chunk_scan_chunk_state_bwd_dx (B1+B4+B9) ->
chunk_state_scan_bwd_dbdc (B5-B8; or dbdc_two_pass's two kernels at dstate >= 256) ->
chunk_cumsum_bwd (B10); mamba_tune.paths lists these per-shape choices. Each stage's public function
is named like mamba-ssm's (`_chunk_state_fwd` -> `chunk_state_fwd`, ...), and each file
declares its kernels' runtime records (ssd_chunk_cumsum, ssd_chunk_state, ssd_chunk_state_passing,
ssd_bmm, ssd_chunk_scan, ssd_chunk_state_passing_bwd, ssd_state_passing_bwd,
ssd_chunk_scan_chunk_state_bwd_dx, ssd_chunk_state_scan_bwd_dbdc, ssd_chunk_cumsum_bwd);
their tuning records are in `autotune_cli/tuning/ssd/`. The submodule selective_state_update
is the decoding step (mamba-ssm `selective_state_update`; `mamba_tune.selective_state_update`
is its public function, not re-exported here so that the submodule keeps its name).
"""

from mamba_tune.ssd.bmm import bmm_chunk_fwd
from mamba_tune.ssd.chunk_cumsum import chunk_cumsum_fwd
from mamba_tune.ssd.chunk_scan import chunk_scan_fwd
from mamba_tune.ssd.chunk_state import chunk_state_fwd
from mamba_tune.ssd.chunk_state_passing import chunk_state_passing_fwd
from mamba_tune.ssd.combined import mamba_chunk_scan_combined, ssd_backward, ssd_forward

__all__ = [
    "bmm_chunk_fwd",
    "chunk_cumsum_fwd",
    "chunk_scan_fwd",
    "chunk_state_fwd",
    "chunk_state_passing_fwd",
    "mamba_chunk_scan_combined",
    "ssd_backward",
    "ssd_forward",
]
