"""The conv1d tuning records: each problem passes the tuner's accuracy check in ref mode,
and a broken output fails it (the check compares what the record says it compares)."""

from __future__ import annotations

import pytest
import torch

from autotune_cli.spec import DEFAULT_TOLERANCES
from autotune_cli.tuner import check_accuracy
from autotune_cli.tuning import get
from mamba_tune.keys import ModelShape

pytestmark = pytest.mark.usefixtures("conv_ref_mode")

SHAPE = ModelShape(batch=2, seqlen=50, nheads=2, headdim=8, ngroups=1, dstate=8, chunk_size=16, packed=True)


def _cases() -> list[tuple[str, str, dict[str, int]]]:
    fwd = get("causal_conv1d_fwd").dims_for(SHAPE)
    slide = get("causal_conv1d_bwd_slide").dims_for(SHAPE)
    # The two kernels are planned at no layer (its calls are channel-last): their dims from slide's.
    assert get("causal_conv1d_bwd").dims_for(SHAPE) is None and get("causal_conv1d_bwd_dx").dims_for(SHAPE) is None
    bwd = {k: slide[k] for k in get("causal_conv1d_bwd").dims}
    bwd_dx = {k: slide[k] for k in get("causal_conv1d_bwd_dx").dims}
    upd = get("causal_conv1d_update").dims_for(SHAPE)
    states = {"has_seq_idx": 0, "has_initial_states": 1}
    return [
        ("fwd-mixer", "causal_conv1d_fwd", fwd),
        ("fwd-contiguous-states", "causal_conv1d_fwd", {**fwd, **states, "channel_last": 0, "width": 3}),
        ("slide-mixer", "causal_conv1d_bwd_slide", slide),
        ("slide-states", "causal_conv1d_bwd_slide", {**slide, "has_seq_idx": 0, "has_initial_states": 1,
                                                     "has_dinitial_states": 1, "has_dfinal": 1}),
        ("slide-nosilu-w2", "causal_conv1d_bwd_slide", {**slide, "silu": 0, "width": 2, "has_bias": 0}),
        ("bwd-mixer", "causal_conv1d_bwd", bwd),
        ("bwd-states", "causal_conv1d_bwd", {**bwd, **states}),
        ("bwd-contiguous-nosilu", "causal_conv1d_bwd", {**bwd, "channel_last": 0, "silu": 0, "width": 2}),
        ("bwd_dx-mixer", "causal_conv1d_bwd_dx", bwd_dx),
        ("bwd_dx-states", "causal_conv1d_bwd_dx", {**bwd_dx, "has_seq_idx": 0, "has_dinitial_states": 1,
                                                   "has_dfinal": 1}),
        ("bwd_dx-contiguous", "causal_conv1d_bwd_dx", {**bwd_dx, "channel_last": 0, "width": 3}),
        ("update-decode", "causal_conv1d_update", upd),
        ("update-slots", "causal_conv1d_update", {**upd, "seqlen": 3, "state_len": 6, "has_cache_seqlens": 1,
                                                  "has_state_indices": 1}),
    ]


@pytest.mark.parametrize(("name", "dims"), [c[1:] for c in _cases()], ids=[c[0] for c in _cases()])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_problem_passes_the_accuracy_check(name: str, dims: dict[str, int], dtype: str) -> None:
    tk = get(name)
    assert tuple(dims) == tk.dims
    problem = tk.make_problem(dims, {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype], torch.device("cpu"), 0)
    assert tk.dims_from_args(problem.args) == dims
    result = problem.run(tk.kernel)
    acc = check_accuracy(problem, result, DEFAULT_TOLERANCES[dtype])
    assert acc.passed, acc
    # The same check fails for a wrong output.
    spoiled = problem.outputs(result)
    first = next(iter(spoiled))
    broken = type(problem)(**{**problem.__dict__, "outputs": lambda res: {**spoiled, first: spoiled[first] + 1.0}})
    assert not check_accuracy(broken, result, DEFAULT_TOLERANCES[dtype]).passed


def test_a_failing_baseline_costs_its_figure_not_the_entry(monkeypatch, capfd) -> None:
    # A baseline library of another version can fail where the search and its fp32 check did not
    # (a call's signature changed): the entry is kept, without a baseline, and one line says why.
    import dataclasses

    from autotune_cli import tuner
    from autotune_cli.spec import Budget

    real = get("causal_conv1d_fwd")

    def broken(*_args: object) -> None:
        raise TypeError("causal_conv1d_fwd_function() takes 6 positional arguments but 7 were given\nmore")

    monkeypatch.setattr(tuner, "get", lambda name: dataclasses.replace(real, make_baseline=broken))
    out = tuner.tune(real.name, real.dims_for(SHAPE), "bf16", Budget(effort="none"), DEFAULT_TOLERANCES["bf16"])
    assert out.entry is not None, out.failure
    assert out.entry.accuracy.passed and out.entry.timing.baseline_ms is None and out.entry.timing.baseline is None
    err = capfd.readouterr().err
    assert ("mamba-tune: causal_conv1d_fwd: baseline failed, entry kept without it: TypeError: "
            "causal_conv1d_fwd_function() takes 6 positional arguments but 7 were given\n") in err, err


@pytest.mark.parametrize("name", ["causal_conv1d_fwd", "causal_conv1d_bwd_slide"])
def test_row_stride_lays_the_inputs_out_as_the_layers_slice(name: str) -> None:
    """The layer kernels' dims carry the layer's row stride (in_proj's output is 2 * 16 + 2 * 8 + 2
    = 50 elements a position here); the problem lays x (and the backward's dx, which the layer
    writes into its slice of the input gradient) out so, with the values of the dense problem
    (row_stride 32: dim 32), and the runtime reads the same dims back from the arguments."""
    from mamba_tune import keys

    tk = get(name)
    dims = tk.dims_for(SHAPE)
    assert dims["row_stride"] == keys.in_proj_width(SHAPE) == 50
    sliced = tk.make_problem(dims, torch.bfloat16, torch.device("cpu"), 0)
    dense = tk.make_problem({**dims, "row_stride": 32}, torch.bfloat16, torch.device("cpu"), 0)
    x_dense, x = dense.args[0], sliced.args[0]
    assert torch.equal(x, x_dense) and x.stride(1) == 1 and x_dense.stride(2) == 32
    assert x.stride(2) == 50 and x.stride(0) == 50 * dims["seqlen"]
    assert tk.dims_from_args(sliced.args) == dims and tk.dims_from_args(dense.args) == {**dims, "row_stride": 32}
    if name == "causal_conv1d_bwd_slide":
        assert sliced.args[7].stride() == x.stride()
    result = sliced.run(tk.kernel)
    assert check_accuracy(sliced, result, DEFAULT_TOLERANCES["bf16"]).passed


@pytest.mark.parametrize("name", ["causal_conv1d_fwd", "causal_conv1d_bwd_slide"])
def test_a_row_stride_narrower_than_a_row_is_refused(name: str) -> None:
    dims = {**get(name).dims_for(SHAPE), "row_stride": 31}
    with pytest.raises(ValueError, match="row_stride 31 < the 32 elements of a row"):
        get(name).make_problem(dims, torch.bfloat16, torch.device("cpu"), 0)
