"""The conv1d backward that steps one position's row of channels at a time (`causal_conv1d_bwd_slide`,
MAMBA_TUNE_CONV1D_BWD=slide) against the two kernels, in Helion ref mode on the CPU: every option,
width 2-4, odd sizes (seqlen shorter than the width, chunks and channel blocks that do not divide);
the layouts and the aliasing that take the two kernels instead. test_conv1d_ref_mode.py runs every
reference test on this path too.

The slide kernel does the two kernels' fp32 operations in their order (pre-activation taps k = 0 ..
width - 1, dx's taps j = 0 .. width - 1), so without SiLU dx is theirs bit for bit; with SiLU, ref
mode's torch.sigmoid rounds one position's row (here) and a tile of positions (there) through
different CPU code paths, a few fp32 ulps apart. dweight and dbias group their positions' partial
sums otherwise.
"""

from __future__ import annotations

import pytest
import torch
from test_conv1d_ref_mode import OPTIONS, Case

from mamba_tune.conv1d import causal_conv1d as conv
from mamba_tune.conv1d import conv1d_backward
from mamba_tune.record import record_calls

pytestmark = pytest.mark.usefixtures("conv_ref_mode")


def _backward(case: Case, monkeypatch: pytest.MonkeyPatch, path: str, dinit: bool) -> tuple[torch.Tensor | None, ...]:
    monkeypatch.setenv("MAMBA_TUNE_CONV1D_BWD", path)
    return conv1d_backward(case.x, case.weight, case.bias, case.dout, case.seq_idx, case.init, case.dfinal, None,
                           dinit, case.activation is not None)


def _close(name: str, a: torch.Tensor, b: torch.Tensor, bitwise: bool) -> None:
    if bitwise:
        assert torch.equal(a, b), f"{name}: {(a - b).abs().max().item():.3e} apart"
    else:
        assert ((a - b).abs() <= 8 * torch.finfo(torch.float32).eps * b.abs() + 1e-6).all(), name


@pytest.mark.parametrize("shape", [(2, 6, 29), (1, 4, 5), (2, 3, 2)], ids=["L29", "L5", "L2-under-width"])
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("width", [2, 3, 4])
def test_the_slide_kernel_gives_the_two_kernels_gradients(width: int, option: str, shape: tuple[int, int, int],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    case = Case("channel_last", width, option, shape=shape)
    dinit = case.init is not None
    split = _backward(case, monkeypatch, "split", dinit)
    slide = _backward(case, monkeypatch, "slide", dinit)
    bitwise = case.activation is None
    _close("dx", slide[0], split[0], bitwise)
    assert slide[0].stride() == case.x.stride()  # channel-last stays channel-last
    if dinit:
        _close("dinitial_states", slide[3], split[3], bitwise)
    else:
        assert slide[3] is None and split[3] is None
    for name, a, b in (("dweight", slide[1], split[1]), ("dbias", slide[2], split[2])):
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert (a - b).abs().max() <= 1e-5 * max(b.abs().max().item(), 1.0), name


def _kernels_run(case: Case, monkeypatch: pytest.MonkeyPatch, tmp_path, dx=None) -> set[str]:
    monkeypatch.setenv("MAMBA_TUNE_CONV1D_BWD", "slide")
    with record_calls(tmp_path / "calls.json") as rec:
        conv1d_backward(case.x, case.weight, case.bias, case.dout, case.seq_idx, None, None, dx, False, True)
        calls = rec.snapshot()["calls"]
    return {c["kernel"] for c in calls.values()}


def test_the_variable_picks_the_slide_kernel_where_rows_are_unit_stride(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path) -> None:
    two = {"causal_conv1d_bwd", "causal_conv1d_bwd_dx"}
    assert _kernels_run(Case("channel_last", 4, "seq_idx-bias-silu"), monkeypatch, tmp_path) == {
        "causal_conv1d_bwd_slide"}
    # (batch, dim, seqlen) contiguous: one row of channels would be dim cache lines.
    assert _kernels_run(Case("contiguous", 4, "seq_idx-bias-silu"), monkeypatch, tmp_path) == two
    # dx in dout's memory: programs read dout past their own positions while others write dx.
    case = Case("channel_last", 4, "seq_idx-bias-silu")
    assert _kernels_run(case, monkeypatch, tmp_path, dx=case.dout) == two
    monkeypatch.delenv("MAMBA_TUNE_CONV1D_BWD")
    assert conv.bwd_path() == "split"  # the two kernels until a one-kernel form is timed faster on a GPU
