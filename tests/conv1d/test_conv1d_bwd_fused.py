"""The conv1d backward in one kernel (`causal_conv1d_bwd_fused`, MAMBA_TUNE_CONV1D_BWD=fused)
against the two kernels, in Helion ref mode on the CPU: the same bits for dx (and for dweight
and dbias where no initial states' gradient shifts the positions' partial sums), the path the
variable picks, and the two kernels where dx shares dout's memory. test_conv1d_ref_mode.py
runs every reference test on both paths."""

from __future__ import annotations

import pytest
import torch
from test_conv1d_ref_mode import OPTIONS, Case

from mamba_tune.conv1d import causal_conv1d as conv
from mamba_tune.conv1d import conv1d_backward
from mamba_tune.record import record_calls

pytestmark = pytest.mark.usefixtures("conv_ref_mode")


def _backward(case: Case, monkeypatch: pytest.MonkeyPatch, path: str, dinit: bool) -> tuple[torch.Tensor | None, ...]:
    monkeypatch.setenv(conv.BWD_PATH, path)
    return conv1d_backward(case.x, case.weight, case.bias, case.dout, case.seq_idx, case.init, case.dfinal, None,
                           dinit, case.activation is not None)


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("layout", ["contiguous", "channel_last"])
def test_one_kernel_gives_the_two_kernels_bits(layout: str, width: int, option: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    case = Case(layout, width, option, shape=(2, 6, 29))
    dinit = case.init is not None
    split = _backward(case, monkeypatch, "split", dinit)
    fused = _backward(case, monkeypatch, "fused", dinit)
    assert torch.equal(fused[0], split[0]), "dx"
    assert fused[0].stride() == case.x.stride()
    if dinit:
        assert torch.equal(fused[3], split[3]), "dinitial_states"
        # Positions start width - 1 earlier: the per-program partial sums group them otherwise.
        for name, a, b in (("dweight", fused[1], split[1]), ("dbias", fused[2], split[2])):
            if a is not None:
                assert (a - b).abs().max() < 1e-5, name
    else:
        assert fused[3] is None and split[3] is None
        assert torch.equal(fused[1], split[1]), "dweight"
        assert (fused[2] is None and split[2] is None) or torch.equal(fused[2], split[2]), "dbias"


def _kernels_run(case: Case, monkeypatch: pytest.MonkeyPatch, path: str, tmp_path, dx=None) -> set[str]:
    monkeypatch.setenv(conv.BWD_PATH, path)
    with record_calls(tmp_path / f"{path}.json") as rec:
        conv1d_backward(case.x, case.weight, case.bias, case.dout, case.seq_idx, None, None, dx, False, True)
        calls = rec.snapshot()["calls"]
    return {c["kernel"] for c in calls.values()}


def test_the_variable_picks_the_path(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    case = Case("channel_last", 4, "seq_idx-bias-silu")
    assert _kernels_run(case, monkeypatch, "fused", tmp_path) == {"causal_conv1d_bwd_fused"}
    assert _kernels_run(case, monkeypatch, "split", tmp_path) == {"causal_conv1d_bwd", "causal_conv1d_bwd_dx"}
    monkeypatch.delenv(conv.BWD_PATH)
    assert conv.bwd_path() == "split"  # the two kernels until the one is timed on a GPU
    # dx in dout's memory: programs of the one kernel would read dout where others write dx.
    dout = case.dout.clone()
    case.dout = dout
    assert _kernels_run(case, monkeypatch, "fused", tmp_path, dx=dout) == {"causal_conv1d_bwd",
                                                                          "causal_conv1d_bwd_dx"}


def test_a_bad_value_of_the_variable_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(conv.BWD_PATH, "one")
    with pytest.raises(ValueError, match=r"MAMBA_TUNE_CONV1D_BWD='one': expected 'fused', 'slide', 'split' or unset"):
        conv.bwd_path()
