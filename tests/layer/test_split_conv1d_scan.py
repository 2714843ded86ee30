"""`mamba_split_conv1d_scan_combined` in Helion ref mode against the fp32 references.

Outputs and every gradient (zxbcdt, conv weight and bias, dt_bias, A, D, initial_states,
rmsnorm_weight, out_proj weight and bias) against autograd through
`autotune_cli.reference.split_conv1d_scan_ref` (the project's conv1d, SSD and gated-norm
references composed), and against mamba-ssm's own `mamba_split_conv1d_scan_ref` run on
CPU (its CUDA / Triton leaves swapped for mamba-ssm's own torch references).

Bound: err(kernel) <= 2 * err(the reference evaluated in the inputs' dtype) + atol * scale,
both against the fp32 reference, scale = max(1, max |reference|).
"""

from __future__ import annotations

import functools
import importlib
import json
from typing import Any

import mamba_ssm_cpu
import pytest
import torch
from layer_inputs import Layer

import mamba_tune
from autotune_cli.reference import causal_conv1d_ref, split_conv1d_scan_ref
from mamba_tune.layer.split_conv1d_scan import split_conv1d_scan_backward, split_conv1d_scan_forward

pytestmark = pytest.mark.usefixtures("layer_ref_mode")


def ours(*args: Any, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return mamba_tune.mamba_split_conv1d_scan_combined(*args, return_final_states=True, **kw)


def _run(fn: Any, layer: Layer, dout: torch.Tensor | None, dfinal: torch.Tensor | None
         ) -> dict[str, torch.Tensor | None]:
    """fn's (out, final_states) and the gradients of every tensor input for (dout, dfinal)."""
    leaves = layer.leaves()
    args, kw = layer.call_args(leaves)
    out, final = fn(*args, **kw)
    result: dict[str, torch.Tensor | None] = {"out": out.detach(), "final_states": final.detach()}
    if dout is not None:
        roots, grads = [out], [dout.to(out.dtype)]
        if dfinal is not None:
            roots.append(final)
            grads.append(dfinal)
        got = torch.autograd.grad(roots, list(leaves.values()), grads, allow_unused=True)
        for name, g in zip(leaves, got, strict=True):
            result[name] = None if g is None else g.detach()
    return result


def _reference(layer: Layer, dout: torch.Tensor, dfinal: torch.Tensor | None, upcast: bool
               ) -> dict[str, torch.Tensor | None]:
    """The reference's outputs and gradients: in fp32 (upcast) or in the inputs' dtypes (eager)."""
    if upcast:
        layer = Layer({k: None if v is None else v.float() for k, v in layer.tensors.items()}, layer.seq_idx,
                      layer.kwargs, layer.chunk_size)
        dout = dout.float()
    return _run(functools.partial(split_conv1d_scan_ref, upcast=upcast), layer, dout, dfinal)


def _assert_bounded(name: str, got: torch.Tensor, ref: torch.Tensor, low: torch.Tensor, atol: float) -> None:
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert not got.isnan().any(), f"{name}: NaN"
    err = (got.float() - ref.float()).abs().max().item()
    scale = max(1.0, ref.float().abs().max().item())
    bound = 2 * (low.float() - ref.float()).abs().max().item() + atol * scale
    assert err <= bound, f"{name}: max error {err:.3e} > 2 * eager error + atol * scale = {bound:.3e}"


OPTIONS = [
    pytest.param({"norm_before_gate": False}, id="norm-after-gate"),
    pytest.param({"norm_before_gate": True, "D_per_head": False}, id="norm-before-gate-D-hdim"),
    pytest.param({"rmsnorm": False}, id="no-norm-z-gate"),
    pytest.param({"seq_idx": True, "initial_states": True, "dfinal": True}, id="seq_idx-init-dfinal"),
    pytest.param({"d_mlp": 6, "outproj_bias": False, "ngroups": 1}, id="d_mlp-outproj-no-bias-G1"),
    pytest.param({"out_dim": None, "conv_bias": False, "activation": None, "dt_limit": (0.01, 0.2)},
                 id="no-outproj-no-conv-bias-no-act-dt_limit"),
    pytest.param({"rmsnorm": False, "d_mlp": 4, "seq_idx": True, "initial_states": True, "D_per_head": False,
                  "dfinal": True, "nheads": 2, "ngroups": 2}, id="no-norm-d_mlp-seq_idx-init-G2-H2"),
]
DTYPES = [pytest.param(torch.float32, 2e-5, id="fp32"), pytest.param(torch.bfloat16, 2e-2, id="bf16")]


def _layer(options: dict[str, Any], dtype: torch.dtype, seed: int = 0) -> tuple[Layer, bool]:
    opts = dict(options)
    with_dfinal = opts.pop("dfinal", False)
    return Layer.make(dtype, seed, **opts), with_dfinal


def _out_grads(layer: Layer, with_dfinal: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    args, kw = layer.call_args({k: v for k, v in layer.tensors.items() if v is not None})
    out, final = split_conv1d_scan_forward(*args, **kw)
    gen = torch.Generator().manual_seed(1)
    dout = torch.randn(*out.shape, generator=gen).to(out.dtype)
    return dout, torch.randn(*final.shape, generator=gen) if with_dfinal else None


@pytest.mark.parametrize("dtype,atol", DTYPES)
@pytest.mark.parametrize("options", OPTIONS)
def test_forward_and_gradients_match_the_reference(options, dtype, atol, nan_empty):
    # nan_empty: the gradient of zxbcdt is one torch.empty buffer written piece by piece.
    layer, with_dfinal = _layer(options, dtype)
    dout, dfinal = _out_grads(layer, with_dfinal)
    got = _run(ours, layer, dout, dfinal)
    ref32 = _reference(layer, dout, dfinal, upcast=True)
    low = _reference(layer, dout, dfinal, upcast=False)
    expected = {"out", "final_states", *(k for k, v in layer.tensors.items() if v is not None)}
    assert set(got) == set(ref32) == expected
    assert got["out"].dtype == dtype and got["final_states"].dtype == torch.float32
    for name in sorted(expected):
        assert got[name] is not None, f"{name}: no gradient"
        if name in layer.tensors:
            assert got[name].dtype == layer.tensors[name].dtype, f"{name}: gradient dtype"
        _assert_bounded(name, got[name], ref32[name], low[name], atol)


def test_the_backward_is_bitwise_reproducible():
    layer, _ = _layer({"seq_idx": True, "initial_states": True, "d_mlp": 4}, torch.bfloat16)
    dout, dfinal = _out_grads(layer, True)
    first = _run(ours, layer, dout, dfinal)
    second = _run(ours, layer, dout, dfinal)
    for name, t in first.items():
        assert t is not None and second[name] is not None
        assert torch.equal(t, second[name]), f"{name} differs between two runs"


def test_the_functional_backward_matches_autograd():
    """split_conv1d_scan_backward (what the Function runs) against the Function's own gradients,
    without out_proj or dfinal: the paths where dout arrives directly and final_states is unused."""
    layer, _ = _layer({"out_dim": None, "norm_before_gate": True}, torch.float32)
    dout, _ = _out_grads(layer, False)
    via_autograd = _run(ours, layer, dout, None)
    args, kw = layer.call_args({k: v for k, v in layer.tensors.items() if v is not None})
    grads = split_conv1d_scan_backward(dout, None, *args, **kw)
    for name, t in grads.items():
        if layer.tensors[name] is None:
            assert t is None, name
        else:
            assert torch.equal(t, via_autograd[name]), name


def test_no_grad_and_return_final_states():
    layer, _ = _layer({"initial_states": True}, torch.float32)
    args, kw = layer.call_args({k: v for k, v in layer.tensors.items() if v is not None})
    with torch.no_grad():
        out = mamba_tune.mamba_split_conv1d_scan_combined(*args, **kw)
        out2, final = mamba_tune.mamba_split_conv1d_scan_combined(*args, return_final_states=True, **kw)
    assert isinstance(out, torch.Tensor) and torch.equal(out, out2)
    assert final.shape == (2, 4, 8, 16) and final.dtype == torch.float32


@pytest.mark.parametrize("change,match", [
    pytest.param({"zxbcdt": torch.zeros(2, 40)}, r"zxbcdt must be a non-empty \(batch, seqlen, d_in_proj\)",
                 id="zxbcdt-2d"),
    pytest.param({"zxbcdt": torch.zeros(2, 40, 201)}, r"zxbcdt's last dim 201 != 2 \* d_mlp", id="d_in_proj"),
    pytest.param({"conv1d_weight": torch.zeros(97, 4)}, r"conv1d_weight's 97 channels", id="conv-channels"),
    pytest.param({"conv1d_bias": torch.zeros(5)}, r"conv1d_bias shape \(5,\) != \(96,\)", id="conv-bias"),
    pytest.param({"dt_bias": torch.zeros(3)}, r"dt_bias shape \(3,\) != \(nheads,\) = \(4,\)", id="dt_bias"),
    pytest.param({"A": torch.zeros(5)}, r"A shape \(5,\) != \(nheads,\) = \(4,\)", id="A"),
    pytest.param({"rmsnorm_weight": torch.zeros(7)}, r"rmsnorm_weight shape \(7,\) != \(dim,\) = \(32,\)",
                 id="rmsnorm"),
    pytest.param({"outproj_weight": torch.zeros(24, 31)}, r"outproj_weight shape \(24, 31\)", id="outproj"),
    pytest.param({"outproj_bias": torch.zeros(3)}, r"outproj_bias shape \(3,\) != \(out_dim,\) = \(24,\)",
                 id="outproj-bias"),
    pytest.param({"headdim": None}, r"D is per head \(4,\): pass headdim", id="no-headdim"),
    pytest.param({"headdim": 16, "D": torch.zeros(4, 8)}, r"headdim=16 != D's", id="headdim-vs-D"),
    pytest.param({"ngroups": 3}, r"ngroups=3 does not divide nheads=4", id="ngroups"),
    pytest.param({"activation": "gelu"}, r"activation 'gelu' is not one of", id="activation"),
])
def test_bad_arguments_raise_value_errors_naming_the_sizes(change, match):
    layer, _ = _layer({}, torch.float32)
    args, kw = layer.call_args({k: v for k, v in layer.tensors.items() if v is not None})
    named = dict(zip(("zxbcdt", "conv1d_weight", "conv1d_bias", "dt_bias", "A", "D", "chunk_size"), args,
                     strict=True))
    named.update(kw)
    named.update(change)
    with pytest.raises(ValueError, match="mamba_split_conv1d_scan_combined: " + match):
        mamba_tune.mamba_split_conv1d_scan_combined(**named)


def test_outproj_bias_without_weight_is_refused():
    layer, _ = _layer({"out_dim": None}, torch.float32)
    args, kw = layer.call_args({k: v for k, v in layer.tensors.items() if v is not None})
    kw["outproj_bias"] = torch.zeros(3)
    with pytest.raises(ValueError, match="outproj_bias without outproj_weight"):
        mamba_tune.mamba_split_conv1d_scan_combined(*args, **kw)


# --- mamba-ssm's own reference ------------------------------------------------------------


@pytest.fixture
def mamba_ssm_ref(monkeypatch: pytest.MonkeyPatch) -> Any:
    """mamba-ssm's `mamba_split_conv1d_scan_ref`, runnable on CPU: its causal_conv1d call (an
    optional CUDA package) runs the project's conv reference, its selective scan mamba-ssm's
    own `selective_scan_ref` and its Triton rmsnorm mamba-ssm's own `rms_norm_ref`."""
    if not mamba_ssm_cpu.installed():
        pytest.skip("mamba-ssm is not installed (.ci/run installs it)")
    mamba_ssm_cpu.load()
    # Its selective_scan_interface imports the CUDA extension at the top (selective_scan_ref is
    # plain torch): importable here, and gone again after the test.
    with mamba_ssm_cpu.mamba1_importable():
        interface = importlib.import_module("mamba_ssm.ops.selective_scan_interface")
        monkeypatch.setattr(interface, "selective_scan_fn", interface.selective_scan_ref)
        ssd_combined = importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
        layernorm_gated = importlib.import_module("mamba_ssm.ops.triton.layernorm_gated")

        def conv(x, weight, bias=None, activation=None):
            return causal_conv1d_ref(x, weight, bias, activation=activation)[0]

        monkeypatch.setattr(ssd_combined, "causal_conv1d_fn", conv)
        monkeypatch.setattr(ssd_combined, "rmsnorm_fn", layernorm_gated.rms_norm_ref)
        yield ssd_combined.mamba_split_conv1d_scan_ref


# Its signature has no initial_states, seq_idx or d_mlp. With a norm, ngroups is 1: the
# reference normalizes whole rows (it passes no group_size), while mamba-ssm's fused
# function and Mamba2's unfused path (RMSNormGated(group_size=d_ssm // ngroups)) normalize
# per group, as ours does; the group-wise norm is checked against Mamba2 in test_mamba2_module.py.
MAMBA_SSM_OPTIONS = [
    pytest.param({"norm_before_gate": False, "ngroups": 1}, id="norm-after-gate-G1"),
    pytest.param({"norm_before_gate": True, "ngroups": 1, "D_per_head": False, "dt_limit": (0.01, 0.2)},
                 id="norm-before-gate-G1-D-hdim-dt_limit"),
    pytest.param({"rmsnorm": False, "ngroups": 2}, id="no-norm-G2"),
]


@pytest.mark.parametrize("options", MAMBA_SSM_OPTIONS)
def test_forward_and_gradients_match_mamba_ssms_reference(mamba_ssm_ref, options):
    layer, _ = _layer(options, torch.float32)
    dout, _ = _out_grads(layer, False)
    got = _run(ours, layer, dout, None)
    leaves = layer.leaves()
    args, kw = layer.call_args(leaves)
    for k in ("initial_states", "seq_idx"):
        assert kw.pop(k) is None
    out = mamba_ssm_ref(*args, **kw)
    grads = torch.autograd.grad(out, list(leaves.values()), dout)
    assert (got["out"] - out).abs().max().item() <= 2e-5 * max(1.0, out.abs().max().item())
    for name, g in zip(leaves, grads, strict=True):
        err = (got[name] - g).abs().max().item()
        assert err <= 2e-5 * max(1.0, g.abs().max().item()), f"{name}: max error {err:.3e}"


def test_autocast_runs_out_proj_in_the_autocast_dtype():
    """As mamba-ssm under autocast: out_proj's GEMM (forward and backward) in the autocast dtype,
    the output in it, every gradient in its input's dtype and close to the fp32 call's."""
    layer, _ = _layer({"d_mlp": 4}, torch.float32)
    dout, _ = _out_grads(layer, False)
    full = _run(ours, layer, dout, None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = _run(ours, layer, dout, None)
    assert cast["out"].dtype == torch.bfloat16 and cast["final_states"].dtype == torch.float32
    for name, t in full.items():
        assert cast[name] is not None and cast[name].dtype == (torch.bfloat16 if name == "out" else t.dtype), name
        err = (cast[name].float() - t).abs().max().item()
        assert err <= 3e-2 * max(1.0, t.abs().max().item()), f"{name}: autocast vs fp32 max difference {err:.3e}"


def test_the_ssd_intermediates_handed_to_the_backward_are_the_ones_it_recomputes():
    """ssd_recompute_forward (the layer's backward) gives ssd_forward's output, and ssd_backward
    given its intermediates gives the gradients it computes by itself: bitwise."""
    from mamba_tune.ssd.combined import ssd_backward, ssd_forward, ssd_recompute_forward

    gen = torch.Generator().manual_seed(3)
    b, s, h, p, g, n = 2, 40, 4, 8, 2, 16
    x, z = torch.randn(b, s, h, p, generator=gen), torch.randn(b, s, h, p, generator=gen)
    dt, A = torch.randn(b, s, h, generator=gen), -torch.rand(h, generator=gen) - 0.5
    B, C = torch.randn(b, s, g, n, generator=gen), torch.randn(b, s, g, n, generator=gen)
    kw = {"D": torch.randn(h, generator=gen), "z": z, "dt_bias": torch.randn(h, generator=gen) - 2,
          "initial_states": torch.randn(b, h, p, n, generator=gen), "dt_softplus": True,
          "seq_idx": torch.tensor([[0] * 13 + [1] * 27, [0] * 40], dtype=torch.int32)}
    out, _ = ssd_forward(x, dt, A, B, C, 16, **kw)
    again, inter = ssd_recompute_forward(x, dt, A, B, C, 16, **kw)
    assert torch.equal(out, again)
    dy, dfinal = torch.randn(b, s, h, p, generator=gen), torch.randn(b, h, p, n, generator=gen)
    alone = ssd_backward(dy, dfinal, x, dt, A, B, C, 16, **kw)
    handed = ssd_backward(dy, dfinal, x, dt, A, B, C, 16, **kw, intermediates=inter)
    assert alone.keys() == handed.keys()
    for name, t in alone.items():
        assert t is not None and torch.equal(t, handed[name]), name


def test_gradients_through_final_states_alone():
    """A loss on final_states only: the backward gets no output gradient (zeros stand in)."""
    layer, _ = _layer({"initial_states": True, "seq_idx": True, "activation": "swish"}, torch.float32)
    _, dfinal = _out_grads(layer, True)
    assert dfinal is not None

    def final_only(fn: Any, lay: Layer) -> dict[str, torch.Tensor]:
        leaves = lay.leaves()
        args, kw = lay.call_args(leaves)
        _, final = fn(*args, **kw)
        got = torch.autograd.grad(final, list(leaves.values()), dfinal, allow_unused=True)
        return {k: torch.zeros_like(v) if g is None else g for (k, v), g in zip(leaves.items(), got, strict=True)}

    got = final_only(ours, layer)
    ref = final_only(functools.partial(split_conv1d_scan_ref, upcast=True), layer)
    assert got["zxbcdt"].abs().max() > 0
    for name in got:
        err = (got[name] - ref[name]).abs().max().item()
        assert err <= 2e-5 * max(1.0, ref[name].abs().max().item()), f"{name}: max error {err:.3e}"


@pytest.mark.parametrize("keep", [pytest.param(True, id="keep"), pytest.param(False, id="recompute-all")])
@pytest.mark.parametrize("options,kept_once", [
    # The norm's backward and out_proj's weight gradient need the SSD output: kept (mamba-ssm's
    # own out_x), so F5 is not run again; at these dims nothing else fits beside it.
    pytest.param({}, ["ssd_chunk_scan"], id="norm-out_proj"),
    pytest.param({"rmsnorm": False}, ["ssd_chunk_scan"], id="no-norm-out_proj"),
    # Nothing needs the output: it is never recomputed, and F1's dA_cumsum and dt~ fit in its
    # bytes (the states, in fp32 here, do not).
    pytest.param({"rmsnorm": False, "out_dim": None}, ["ssd_chunk_scan", "ssd_chunk_cumsum"], id="no-norm-no-out_proj"),
])
def test_one_training_step_runs_each_backward_kernel_once_and_recomputes_what_was_not_kept(
        tmp_path, monkeypatch, options, kept_once, keep):
    """The forward, then the backward's recompute of what the forward did not keep (conv, SSD
    F1-F5) handing the SSD's F1-F4 to its backward: no third recompute; the norm's forward runs
    once (its backward recomputes the statistics and the output in its pass). (Counted by the
    runtime's call record.)"""
    from mamba_tune.ssd import combined

    monkeypatch.setattr(combined, "SAVE_INTERMEDIATES", keep)
    layer, _ = _layer(options, torch.float32)
    dout, _ = _out_grads(layer, False)
    path = tmp_path / "calls.json"
    with mamba_tune.record_calls(path):
        _run(ours, layer, dout, None)
    calls = {v["kernel"]: v["calls"] for v in json.loads(path.read_text())["calls"].values()}
    forward = ["causal_conv1d_fwd", "ssd_chunk_cumsum", "ssd_chunk_state_passing", "ssd_bmm", "ssd_chunk_scan"]
    # B2 + B3 at the layer's 4 heads: F2's kernel then the elementwise walk (combined.split_state_passing_bwd).
    assert combined.split_state_passing_bwd(2, 4, 16)
    backward = ["causal_conv1d_bwd_slide", "ssd_chunk_state", "ssd_state_passing_bwd",
                "ssd_chunk_scan_chunk_state_bwd_dx", "ssd_chunk_state_scan_bwd_dbdc", "ssd_chunk_cumsum_bwd"]
    once = [k for k in kept_once if keep or k == "ssd_chunk_scan" and "out_dim" in options]
    if "rmsnorm" not in options:
        once.append("gated_norm_fwd")
        backward.append("gated_norm_bwd")
    expected = {**dict.fromkeys(forward, 2), **dict.fromkeys(once, 1), **dict.fromkeys(backward, 1)}
    assert calls == expected


@pytest.mark.parametrize("options", [pytest.param({"seq_idx": True, "initial_states": True, "dfinal": True},
                                                  id="norm-seq_idx-init-dfinal"),
                                     pytest.param({"rmsnorm": False, "out_dim": None}, id="no-norm-no-out_proj")])
def test_kept_ssd_output_and_intermediates_give_the_recomputed_gradients_bitwise(monkeypatch, options):
    from mamba_tune.ssd import combined

    layer, with_dfinal = _layer(options, torch.bfloat16, seed=3)
    dout, dfinal = _out_grads(layer, with_dfinal)
    kept = _run(ours, layer, dout, dfinal)
    monkeypatch.setattr(combined, "SAVE_INTERMEDIATES", False)
    recomputed = _run(ours, layer, dout, dfinal)
    for name, t in kept.items():
        assert t is not None and recomputed[name] is not None, name
        assert torch.equal(t, recomputed[name]), f"{name}: keeping the forward's tensors changes it"


def test_the_conv1d_keys_the_layer_calls_are_the_ones_a_spec_plans(tmp_path):
    """The layer's conv reads xBC as a slice of zxbcdt (2 * 32 + 2 * 2 * 16 + 4 = 132 elements a
    position: row_stride 132), forward and backward: the recorded keys equal the planned dims
    (mamba_tune.keys.conv1d_fwd_dims), so a tuned entry serves the call exactly."""
    from autotune_cli.tuning import get
    from mamba_tune.keys import ModelShape

    layer = Layer.make(torch.bfloat16, batch=2, seqlen=40)
    leaves = layer.leaves()
    args, kw = layer.call_args(leaves)
    record = tmp_path / "calls.json"
    with mamba_tune.record_calls(record):
        out, _final = ours(*args, **kw)
        out.float().sum().backward()
    calls = {c["kernel"]: c for c in json.loads(record.read_text())["calls"].values()}
    shape = ModelShape(batch=2, seqlen=40, nheads=4, headdim=8, ngroups=2, dstate=16, chunk_size=16)
    for name in ("causal_conv1d_fwd", "causal_conv1d_bwd_slide"):
        assert calls[name]["dims"] == get(name).dims_for(shape), name
        assert calls[name]["dims"]["row_stride"] == 132
