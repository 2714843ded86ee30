"""Tuning records of the SSD family, one module per stage as in `kernels/ssd/` (and the decoding step)."""

from autotune_cli.tuning.ssd import (
    bmm,
    chunk_cumsum,
    chunk_cumsum_bwd,
    chunk_scan,
    chunk_scan_chunk_state_bwd_dx,
    chunk_state,
    chunk_state_passing,
    chunk_state_passing_bwd,
    chunk_state_scan_bwd_dbdc,
    dbdc_two_pass,
    selective_state_update,
    state_passing_bwd,
)

KERNELS = (
    chunk_cumsum.SSD_CHUNK_CUMSUM,
    chunk_state.SSD_CHUNK_STATE,
    chunk_state_passing.SSD_CHUNK_STATE_PASSING,
    bmm.SSD_BMM,
    chunk_scan.SSD_CHUNK_SCAN,
    chunk_state_passing_bwd.SSD_CHUNK_STATE_PASSING_BWD,
    state_passing_bwd.SSD_STATE_PASSING_BWD,
    chunk_scan_chunk_state_bwd_dx.SSD_CHUNK_SCAN_CHUNK_STATE_BWD_DX,
    chunk_state_scan_bwd_dbdc.SSD_CHUNK_STATE_SCAN_BWD_DBDC,
    dbdc_two_pass.SSD_CHUNK_STATE_SCAN_BWD_DCB,
    dbdc_two_pass.SSD_BMM_BWD_DBDC,
    chunk_cumsum_bwd.SSD_CHUNK_CUMSUM_BWD,
    selective_state_update.SELECTIVE_STATE_UPDATE,
)
