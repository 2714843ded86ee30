"""The run-time nearest rule (mamba_tune.runtime.nearest_entry): which entry a shape without its own gets."""

from __future__ import annotations

import dataclasses

import pytest
from bundles import entry, norm_dims

from mamba_tune import runtime
from mamba_tune.norm.gated import GATED_NORM_FWD
from mamba_tune.ssd.chunk_scan import SSD_CHUNK_SCAN


def _scan(**over: int) -> dict[str, int]:
    dims = {"batch": 2, "seqlen": 8192, "nheads": 64, "headdim": 64, "ngroups": 8, "dstate": 128,
            "chunk_size": 128, "has_D": 1, "has_z": 0, "has_seq_idx": 0}
    return {**dims, **over}


def _pick(rk: runtime.RuntimeKernel, dims: dict[str, int], *candidates: dict[str, int]) -> dict[str, int] | None:
    entries = [entry(rk.name, c) for c in candidates]
    near = runtime.nearest_entry(rk, dims, entries)
    return None if near is None else near.dims


def test_distance_sums_log_ratios_over_the_size_dims():
    # Call: batch 2, seqlen 8192, 64 heads. A: 2x the heads (distance log 2). B: 2x batch
    # and 2x seqlen (2 log 2). C: 4x seqlen (log 4, a tie with B); in (batch, seqlen,
    # nheads) order C = (2, 32768, 64) is smaller than B = (4, 16384, 64).
    a, b, c = _scan(nheads=128), _scan(batch=4, seqlen=16384), _scan(seqlen=32768)
    assert _pick(SSD_CHUNK_SCAN, _scan(), b, c, a) == a
    assert _pick(SSD_CHUNK_SCAN, _scan(), b, c) == c  # equal distance: the smaller shape
    # Halving and doubling are equally far (log space), whatever the order of the entries.
    half, double = _scan(seqlen=4096), _scan(seqlen=16384)
    assert _pick(SSD_CHUNK_SCAN, _scan(), double, half) == half
    assert _pick(SSD_CHUNK_SCAN, _scan(), half, double) == half


def test_each_size_dim_within_the_ratio_bound():
    four = runtime.NEAREST_MAX_RATIO
    assert four == 4.0
    # Exactly 4x on a dim is allowed, beyond it is not, even when the total distance is small.
    assert _pick(SSD_CHUNK_SCAN, _scan(), _scan(seqlen=8192 * 4)) == _scan(seqlen=8192 * 4)
    assert _pick(SSD_CHUNK_SCAN, _scan(), _scan(seqlen=8192 * 4 + 128)) is None
    assert _pick(SSD_CHUNK_SCAN, _scan(batch=8), _scan(batch=1)) is None
    # A farther entry within the bound beats a nearer-in-total one that breaks it on one dim.
    # (ok: 3x batch and 2x seqlen, distance log 6; broken: 5x heads, log 5.)
    ok, broken = _scan(batch=6, seqlen=16384), _scan(nheads=64 * 5)
    assert _pick(SSD_CHUNK_SCAN, _scan(), broken, ok) == ok


def test_structural_dims_and_key_shape_must_match():
    assert _pick(SSD_CHUNK_SCAN, _scan(), _scan(ngroups=4, nheads=64)) is None
    assert _pick(SSD_CHUNK_SCAN, _scan(), _scan(has_z=1)) is None
    assert _pick(SSD_CHUNK_SCAN, _scan(), _scan(dstate=64)) is None
    # An entry whose key has other dims (an older kernel's key: F5's had fused_bmm) is never near.
    old = {**_scan(), "fused_bmm": 0}
    assert _pick(SSD_CHUNK_SCAN, _scan(), old) is None
    # The norm varies rows only: d and group size are structure.
    assert GATED_NORM_FWD.size_dims == ("rows",)
    assert _pick(GATED_NORM_FWD, norm_dims(rows=8192), norm_dims(rows=16384, d=2048)) is None
    assert _pick(GATED_NORM_FWD, norm_dims(rows=8192), norm_dims(rows=16384, group_size=256)) is None
    assert _pick(GATED_NORM_FWD, norm_dims(rows=8192), norm_dims(rows=16384)) == norm_dims(rows=16384)


def test_exact_key_is_its_own_nearest():
    assert _pick(SSD_CHUNK_SCAN, _scan(), _scan(nheads=32), _scan()) == _scan()


def test_a_neutral_dim_is_crossed_only_where_no_entry_matches_it():
    # The norm's weight dtype leaves its config space unchanged (tests/tuner/test_warm_start.py): a
    # bf16-weight call takes the fp32-weight entry of its shape when no bf16-weight entry is near.
    assert GATED_NORM_FWD.neutral_dims == ("weight_fp32",)
    call = norm_dims(rows=16384, weight_fp32=0)
    fp32_same = norm_dims(rows=16384, weight_fp32=1)
    assert _pick(GATED_NORM_FWD, call, fp32_same) == fp32_same
    # An entry with the call's own weight dtype ranks first, even one farther in size.
    bf16_far = norm_dims(rows=8192, weight_fp32=0)
    assert _pick(GATED_NORM_FWD, call, fp32_same, bf16_far) == bf16_far
    # Across the neutral dim the size rule still holds, and the other structural dims must match.
    assert _pick(GATED_NORM_FWD, call, norm_dims(rows=16384 * 8, weight_fp32=1)) is None
    assert _pick(GATED_NORM_FWD, call, norm_dims(rows=16384, d=2048, weight_fp32=1)) is None
    # Kernels without neutral dims never cross a structural dim.
    assert SSD_CHUNK_SCAN.neutral_dims == ()
    assert _pick(SSD_CHUNK_SCAN, _scan(), _scan(has_D=0)) is None


def test_neutral_dims_must_be_structural_key_dims():
    with pytest.raises(ValueError, match="neutral_dims"):
        dataclasses.replace(GATED_NORM_FWD.key, neutral_dims=("rows",))
    with pytest.raises(ValueError, match="neutral_dims"):
        dataclasses.replace(GATED_NORM_FWD.key, neutral_dims=("not_a_dim",))
