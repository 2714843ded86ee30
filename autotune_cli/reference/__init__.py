"""The one reference module: fp32, written for clarity; used by tests, the tuner's
accuracy check and the benchmarks alike."""

from autotune_cli.reference.conv1d import (
    causal_conv1d_ref,
    causal_conv1d_taps_ref,
    causal_conv1d_update_ref,
)
from autotune_cli.reference.decode import selective_state_update_ref
from autotune_cli.reference.layer import split_conv1d_scan_ref
from autotune_cli.reference.norm import gated_norm_ref
from autotune_cli.reference.ssd import (
    bmm_chunk_ref,
    chunk_cumsum_ref,
    chunk_scan_ref,
    chunk_state_ref,
    ssd_chunked_ref,
    ssd_dt_ref,
    ssd_recurrent_ref,
    state_passing_ref,
)
from autotune_cli.reference.ssd_bwd import ssd_chunked_grads

__all__ = [
    "bmm_chunk_ref",
    "causal_conv1d_ref",
    "causal_conv1d_taps_ref",
    "causal_conv1d_update_ref",
    "chunk_cumsum_ref",
    "chunk_scan_ref",
    "chunk_state_ref",
    "gated_norm_ref",
    "selective_state_update_ref",
    "split_conv1d_scan_ref",
    "ssd_chunked_grads",
    "ssd_chunked_ref",
    "ssd_dt_ref",
    "ssd_recurrent_ref",
    "state_passing_ref",
]
