"""The one reference module: fp32, written for clarity; used by tests, the tuner's
accuracy check and the benchmarks alike."""

from kernels.reference.norm import gated_norm_ref, gated_norm_stats_ref
from kernels.reference.ssd import (
    bmm_chunk_ref,
    chunk_cumsum_ref,
    chunk_scan_ref,
    chunk_state_ref,
    ssd_chunked_ref,
    ssd_dt_ref,
    ssd_recurrent_ref,
    state_passing_ref,
)
from kernels.reference.ssd_bwd import ssd_chunked_grads

__all__ = [
    "bmm_chunk_ref",
    "chunk_cumsum_ref",
    "chunk_scan_ref",
    "chunk_state_ref",
    "gated_norm_ref",
    "gated_norm_stats_ref",
    "ssd_chunked_grads",
    "ssd_chunked_ref",
    "ssd_dt_ref",
    "ssd_recurrent_ref",
    "state_passing_ref",
]
