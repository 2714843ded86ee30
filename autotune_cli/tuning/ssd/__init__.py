"""Tuning records of the SSD family, one module per stage as in `kernels/ssd/`."""

from autotune_cli.tuning.ssd import (
    bmm,
    chunk_cumsum,
    chunk_scan,
    chunk_state,
    chunk_state_passing,
    state_passing,
)

KERNELS = (
    chunk_cumsum.SSD_CHUNK_CUMSUM,
    chunk_state.SSD_CHUNK_STATE,
    state_passing.SSD_STATE_PASSING,
    chunk_state_passing.SSD_CHUNK_STATE_PASSING,
    bmm.SSD_BMM,
    chunk_scan.SSD_CHUNK_SCAN,
)
