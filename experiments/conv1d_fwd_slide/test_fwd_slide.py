"""The slide forward (fwd_slide.py) against the runtime's conv1d forward in Helion ref mode on the
CPU: bitwise without SiLU, within a few fp32 roundings with it (ref mode's torch.sigmoid takes one
row here and a tile of positions there through different CPU code paths, as for the backward's
slide kernel), at every option, width 2-4, rows of a wider buffer (the layer's slice) and odd sizes
(several chunks and channel blocks, a partial last one); its compiled step loop's carries and its
sm_90 compile on the CPU; the timing script's exit without a GPU:
ssd_bwd_paths/test_ssd_bwd_paths.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from fwd_slide import (
    FWD_SLIDE,
    GRID,
    conv1d_forward_slide,
    default_config,
    fwd_slide_kernel,
    slide_config,
)

from mamba_tune.conv1d import conv1d_forward

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))
from eager_kernels import eager_kernels  # noqa: E402


def _blocks_of_16(min_or_max: int, max_or_none: int | None = None, /) -> int:
    # register_block_size(min, max): the kernel's positions per program, then its channels a row.
    lo, hi = (1, min_or_max) if max_or_none is None else (min_or_max, max_or_none)
    return max(lo, min(16, hi))

# (bias, seq_idx, initial_states, silu)
OPTIONS = {
    "plain": (False, False, False, False),
    "bias-silu": (True, False, False, True),
    "seq_idx-bias-silu": (True, True, False, True),
    "seq_idx-pad": (False, True, False, True),
    "init-silu": (True, False, True, True),
    "init": (False, False, True, False),
}


def _case(width: int, option: str, shape: tuple[int, int, int], row_stride: int | None = None) -> dict:
    bias, seq, init, silu = OPTIONS[option]
    g = torch.Generator().manual_seed(width)
    batch, dim, seqlen = shape
    stride = row_stride or dim
    x = torch.randn(batch, seqlen, stride, generator=g)[..., :dim].transpose(1, 2)  # channel-last rows
    seq_idx = None
    if seq:
        seq_idx = torch.zeros(batch, seqlen, dtype=torch.int32)
        seq_idx[:, seqlen // 3:] = 1
        if option == "seq_idx-pad":
            seq_idx[0, -2:] = -1
    return {"x": x, "weight": torch.randn(dim, width, generator=g),
            "bias": torch.randn(dim, generator=g) if bias else None, "seq_idx": seq_idx,
            "initial_states": torch.randn(batch, dim, width - 1, generator=g) if init else None, "silu": silu}


def _both(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    args = (case["x"], case["weight"], case["bias"], case["seq_idx"], case["initial_states"])
    want = conv1d_forward(*args, None, case["silu"])
    got = conv1d_forward_slide(*args, case["silu"])
    return got, want


def _same(got: torch.Tensor, want: torch.Tensor, silu: bool) -> bool:
    if not silu:
        return torch.equal(got, want)
    return bool(((got - want).abs() <= 8 * torch.finfo(torch.float32).eps * want.abs() + 1e-7).all())


@pytest.mark.skipif(torch.cuda.is_available(), reason="Helion ref mode on CPU tensors")
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_the_output_is_the_runtime_forwards(width: int, option: str):
    # 16-position chunks and 16-channel rows: 3 chunks (a partial one) x 3 channel blocks (a partial one).
    case = _case(width, option, (2, 40, 37), row_stride=53)
    with eager_kernels([fwd_slide_kernel], _blocks_of_16):
        got, want = _both(case)
    assert got.shape == want.shape and got.stride() == (40 * 37, 1, 40)  # channel-last, dense
    assert _same(got, want, case["silu"]), (got - want).abs().max().item()


@pytest.mark.skipif(torch.cuda.is_available(), reason="Helion ref mode on CPU tensors")
def test_one_program_a_row_gives_the_same_output():
    # Ref mode's own block sizes: every position and channel in one program.
    case = _case(4, "seq_idx-bias-silu", (1, 30, 24), row_stride=40)
    with eager_kernels([fwd_slide_kernel]):
        got, want = _both(case)
    assert _same(got, want, True)


def test_bad_input_is_one_line():
    case = _case(4, "plain", (1, 20, 8))
    with pytest.raises(ValueError, match=r"^causal_conv1d: the slide forward takes channel-last x"):
        conv1d_forward_slide(case["x"].contiguous(), case["weight"], None, None, None, True)
    with pytest.raises(ValueError, match=r"^causal_conv1d: x must be"):
        conv1d_forward_slide(case["x"][0], case["weight"], None, None, None, True)


def _meta_args(seq: bool, init: bool) -> tuple:
    b, L, dim, width = 1, 64, 64, 4
    x = torch.empty_strided((b, dim, L), (L * 96, 1, 96), dtype=torch.bfloat16)  # rows 96 apart
    return (x, torch.empty(dim, width, dtype=torch.bfloat16), torch.empty(dim, dtype=torch.bfloat16),
            torch.zeros(b, L, dtype=torch.int32) if seq else None,
            torch.empty(b, dim, width - 1, dtype=torch.bfloat16) if init else None,
            torch.empty_strided((b, dim, L), (L * dim, 1, dim), dtype=torch.bfloat16), width, True)


@pytest.mark.parametrize("seq, init", [(True, False), (False, True)], ids=["seq_idx", "initial_states"])
def test_the_compiled_step_loop_carries_every_kept_row(seq: bool, init: bool):
    """Triton's front end on the CPU (`autotune_cli.lowering.dropped_loop_carries`): the step loop
    carries the x and sequence rows kept from the steps before (bwd_slide.py's bug, caught here)."""
    import helion

    from autotune_cli import lowering

    args = _meta_args(seq, init)
    with lowering.compiled_mode(FWD_SLIDE.kernel):
        bound = FWD_SLIDE.kernel.bind(args)
        dims = FWD_SLIDE.dims_from_args(args)
        for config in (default_config(dims), slide_config(dims, *GRID[6])):
            assert lowering.dropped_loop_carries(bound, helion.Config.from_dict(config), args) == []


def test_every_grid_config_compiles_for_sm90_without_spills():
    """Each config the timing script tries compiles to an sm_90 cubin on the CPU (Triton's whole
    compiler and ptxas), its live rows in registers."""
    import helion

    from autotune_cli import lowering

    args = _meta_args(True, False)
    with lowering.compiled_mode(FWD_SLIDE.kernel):
        bound = FWD_SLIDE.kernel.bind(args)
        dims = FWD_SLIDE.dims_from_args(args)
        for cfg in GRID:
            compiled = lowering.compile_for_gpu(bound, helion.Config.from_dict(slide_config(dims, *cfg)), args)
            usage = lowering.ptxas_usage(compiled)
            assert usage["spill_stores"] == 0, (cfg, usage)

