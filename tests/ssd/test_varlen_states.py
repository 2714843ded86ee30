"""`mamba_chunk_scan_combined(..., cu_seqlens, return_varlen_states=True)` in Helion ref mode on CPU.

Each packed sequence's state at its end, against the fp32 recurrence run on that sequence
alone (`ssd_recurrent_ref`): with seq_idx matching cu_seqlens, sequence i's state is its
own (sequence 0 also carries initial_states). Without seq_idx, mamba-ssm's states carry
across sequences where a sequence spans a chunk boundary; that case is checked against
the recurrence from position 0 too.
"""

from __future__ import annotations

import pytest
import torch

from autotune_cli.reference import ssd_recurrent_ref
from autotune_cli.tuning.ssd.inputs import SSDInputs
from mamba_tune.ssd import mamba_chunk_scan_combined
from mamba_tune.ssd.chunk_state_varlen import chunk_state_varlen

pytestmark = pytest.mark.usefixtures("ssd_ref_mode", "nan_empty")

# (dtype, atol, rtol) against the fp32 recurrence: bf16 rounds the varlen states (in x's
# dtype, as mamba-ssm's) and every operand.
DTYPES = [
    pytest.param(torch.float32, 1e-4, 1e-4, id="fp32"),
    pytest.param(torch.bfloat16, 3e-2, 3e-2, id="bf16"),
]
# Sequence lengths packed in one row of chunk_size 16: boundaries inside chunks and on
# them, a one-token sequence, one spanning three chunks, a short tail.
LENGTHS = [
    pytest.param([7, 9, 1, 40, 13], id="mixed"),
    pytest.param([16, 32, 5], id="on-boundaries"),
    pytest.param([70], id="one-sequence"),
]


def _inputs(lengths: list[int], dtype: torch.dtype, seed: int = 0) -> tuple[SSDInputs, torch.Tensor, torch.Tensor]:
    seqlen = sum(lengths)
    dims = {"batch": 1, "seqlen": seqlen, "nheads": 4, "headdim": 16, "ngroups": 2, "dstate": 16, "chunk_size": 16,
            "has_initial_states": 1, "has_D": 1, "has_dt_bias": 1, "dt_softplus": 1}
    i = SSDInputs.make(dims, dtype, "cpu", seed)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths))[None]
    return i, cu, seq_idx


def _recurrent_state(i: SSDInputs, lo: int, hi: int) -> torch.Tensor:
    """fp32 state after positions lo..hi-1 alone (initial_states only when lo == 0)."""
    sl = slice(lo, hi)
    _, h = ssd_recurrent_ref(i.x[:, sl], i.dt[:, sl], i.A, i.B[:, sl], i.C[:, sl], dt_bias=i.dt_bias,
                             initial_states=i.initial_states if lo == 0 else None, dt_softplus=True)
    return h[0]


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("lengths", LENGTHS)
def test_varlen_states_with_seq_idx_are_each_sequence_alone(lengths, dtype, atol, rtol):
    i, cu, seq_idx = _inputs(lengths, dtype)
    out, final, varlen = mamba_chunk_scan_combined(
        i.x, i.dt, i.A, i.B, i.C, 16, D=i.D, dt_bias=i.dt_bias, initial_states=i.initial_states, seq_idx=seq_idx,
        cu_seqlens=cu, dt_softplus=True, return_final_states=True, return_varlen_states=True)
    assert varlen.shape == (len(lengths), 4, 16, 16) and varlen.dtype == dtype
    expected = torch.stack([_recurrent_state(i, int(cu[k]), int(cu[k + 1])) for k in range(len(lengths))])
    torch.testing.assert_close(varlen.float(), expected, atol=atol, rtol=rtol)
    # The last sequence's state is the call's final state; out is the call without cu_seqlens.
    torch.testing.assert_close(varlen[-1].float(), final[0], atol=atol, rtol=rtol)
    torch.testing.assert_close(out, mamba_chunk_scan_combined(
        i.x, i.dt, i.A, i.B, i.C, 16, D=i.D, dt_bias=i.dt_bias, initial_states=i.initial_states, seq_idx=seq_idx,
        dt_softplus=True))


def test_varlen_states_without_seq_idx_carry_across_sequences_as_mamba_ssm():
    lengths = [7, 9, 1, 40, 13]
    i, cu, _ = _inputs(lengths, torch.float32, seed=3)
    out, varlen = mamba_chunk_scan_combined(i.x, i.dt, i.A, i.B, i.C, 16, dt_bias=i.dt_bias,
                                            initial_states=i.initial_states, cu_seqlens=cu, dt_softplus=True,
                                            return_varlen_states=True)
    for k in range(len(lengths)):
        start, end = int(cu[k]), int(cu[k + 1])
        last_chunk_start = (end - 1) // 16 * 16
        # A sequence that started in an earlier chunk gets the entering state, which here
        # holds everything from position 0.
        lo = 0 if start < last_chunk_start else start
        torch.testing.assert_close(varlen[k], _recurrent_state(i, lo, end), atol=1e-4, rtol=1e-4)


def test_strided_module_layout():
    # x, B, C as the Mamba-2 layer passes them: column slices of one projection.
    lengths = [11, 30]
    i, cu, seq_idx = _inputs(lengths, torch.float32, seed=1)
    L = i.x.shape[1]
    proj = torch.randn(1, L, 64 + 2 * 32 + 5)
    x = proj[..., :64].unflatten(-1, (4, 16))
    B = proj[..., 64:96].unflatten(-1, (2, 16))
    C = proj[..., 96:128].unflatten(-1, (2, 16))
    _, varlen = mamba_chunk_scan_combined(x, i.dt, i.A, B, C, 16, dt_bias=i.dt_bias, seq_idx=seq_idx, cu_seqlens=cu,
                                          dt_softplus=True, return_varlen_states=True)
    _, again = mamba_chunk_scan_combined(x.contiguous(), i.dt, i.A, B.contiguous(), C.contiguous(), 16,
                                         dt_bias=i.dt_bias, seq_idx=seq_idx, cu_seqlens=cu, dt_softplus=True,
                                         return_varlen_states=True)
    torch.testing.assert_close(varlen, again)


def test_cu_seqlens_is_ignored_without_return_varlen_states():
    i, cu, _ = _inputs([7, 9], torch.float32)
    out = mamba_chunk_scan_combined(i.x, i.dt, i.A, i.B, i.C, 16, cu_seqlens=cu)
    assert isinstance(out, torch.Tensor)
    # mamba-ssm reads cu_seqlens only for the varlen states: a batch-2 call with one passes.
    x2 = torch.cat([i.x, i.x])
    out2 = mamba_chunk_scan_combined(x2, torch.cat([i.dt, i.dt]), i.A, torch.cat([i.B, i.B]),
                                     torch.cat([i.C, i.C]), 16, cu_seqlens=cu)
    torch.testing.assert_close(out2[1], out[0])


BAD = [
    pytest.param({"cu_seqlens": None}, r"return_varlen_states=True needs cu_seqlens", id="no-cu_seqlens"),
    pytest.param({"batch2": True}, r"return_varlen_states needs batch 1 .* \(2, 16, 4, 16\)", id="batch-2"),
    pytest.param({"cu_seqlens": torch.tensor([16], dtype=torch.int32)}, r"cu_seqlens must be \(num_sequences \+ 1,\)",
                 id="one-boundary"),
    pytest.param({"cu_seqlens": torch.tensor([[0, 16]], dtype=torch.int32)}, r"got shape \(1, 2\)", id="2d"),
    pytest.param({"cu_seqlens": torch.tensor([0.0, 16.0])}, r"cu_seqlens dtype torch.float32 is not int32 or int64",
                 id="float"),
]


@pytest.mark.parametrize("change,match", BAD)
def test_bad_varlen_arguments_raise_value_error(change, match):
    i, _, _ = _inputs([16], torch.float32)
    args = {"x": i.x, "dt": i.dt, "A": i.A, "B": i.B, "C": i.C, "chunk_size": 16,
            "cu_seqlens": torch.tensor([0, 16], dtype=torch.int32), "return_varlen_states": True}
    if change.pop("batch2", False):
        args.update(x=torch.cat([i.x, i.x]), dt=torch.cat([i.dt, i.dt]), B=torch.cat([i.B, i.B]),
                    C=torch.cat([i.C, i.C]))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        mamba_chunk_scan_combined(**args)


def test_chunk_state_varlen_checks_shapes():
    x, B = torch.randn(32, 4, 16), torch.randn(32, 2, 16)
    dt = dA = torch.randn(4, 2, 16)
    with pytest.raises(ValueError, match=r"chunk_states shape \(2, 4, 16, 8\) != .* \(2, 4, 16, 16\)"):
        chunk_state_varlen(B, x, dt, dA, torch.tensor([0, 32]), torch.randn(2, 4, 16, 8))
