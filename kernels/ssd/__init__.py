"""Mamba-2 SSD family: the forward of mamba-ssm's `mamba_chunk_scan_combined`, one file per stage.

chunk_cumsum (F1) -> chunk_state (F2) -> state_passing (F3, a parallel scan) -> bmm (F4)
-> chunk_scan (F5); chunk_state_passing fuses F2 + F3 (walking the chunks in order);
combined.py chains them. Each stage's public function is named like
mamba-ssm's (`_chunk_state_fwd` -> `chunk_state_fwd`, ...), and each declares its
kernel's runtime record (ssd_chunk_cumsum, ssd_chunk_state, ssd_state_passing,
ssd_chunk_state_passing, ssd_bmm, ssd_chunk_scan); their tuning records are in
`autotune_cli/tuning/ssd/`.
"""

from kernels.ssd.bmm import bmm_chunk_fwd
from kernels.ssd.chunk_cumsum import chunk_cumsum_fwd
from kernels.ssd.chunk_scan import chunk_scan_fwd
from kernels.ssd.chunk_state import chunk_state_fwd
from kernels.ssd.chunk_state_passing import chunk_state_passing_fwd
from kernels.ssd.combined import mamba_chunk_scan_combined, ssd_forward
from kernels.ssd.state_passing import state_passing_fwd

__all__ = [
    "bmm_chunk_fwd",
    "chunk_cumsum_fwd",
    "chunk_scan_fwd",
    "chunk_state_fwd",
    "chunk_state_passing_fwd",
    "mamba_chunk_scan_combined",
    "ssd_forward",
    "state_passing_fwd",
]
