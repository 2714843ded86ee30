"""The causal conv1d forward and backward in Helion ref mode (CPU) against the fp32 reference.

Every option (layout, width, bias, seq_idx, initial and final states, SiLU) in fp32
against `autotune_cli.reference.causal_conv1d_ref` with autograd for the gradients; bf16
within twice eager bf16's error; gradcheck in fp32; the explicit forward/backward the
fused layer calls; determinism; and the shape contract's errors.
"""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch

from autotune_cli.reference import causal_conv1d_ref
from mamba_tune.conv1d import bwd, causal_conv1d_fn, common, conv1d_backward, conv1d_forward, fwd

pytestmark = pytest.mark.usefixtures("conv_ref_mode")


LAYOUTS = ("contiguous", "channel_last")
# (bias, seq_idx, initial_states, final_states, silu)
OPTIONS = {
    "plain": (False, False, False, False, False),
    "bias-silu": (True, False, False, False, True),
    "seq_idx-bias-silu": (True, True, False, False, True),
    "seq_idx-pad": (False, True, False, False, True),
    "init-final-silu": (True, False, True, True, True),
    "init-final": (False, False, True, True, False),
    "final-only": (True, False, False, True, False),
}


def _seq(batch: int, dim: int, seqlen: int, layout: str, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if layout == "channel_last":
        return torch.randn(batch, seqlen, dim, generator=gen).to(dtype).transpose(1, 2)
    return torch.randn(batch, dim, seqlen, generator=gen).to(dtype)


class Case:
    def __init__(self, layout: str, width: int, option: str, dtype: torch.dtype = torch.float32,
                 shape: tuple[int, int, int] = (2, 6, 13), seed: int = 0):
        bias, seq_idx, init, final, silu = OPTIONS[option]
        gen = torch.Generator().manual_seed(seed)
        batch, dim, seqlen = shape
        self.width = width
        self.x = _seq(batch, dim, seqlen, layout, dtype, gen)
        self.weight = (torch.randn(dim, width, generator=gen) * width ** -0.5).to(dtype)
        self.bias = torch.randn(dim, generator=gen).to(dtype) if bias else None
        self.seq_idx = None
        if seq_idx:
            s = torch.zeros(batch, seqlen, dtype=torch.int32)
            s[:, 4:] = 1
            s[-1, 9:] = 2
            if option == "seq_idx-pad":
                s[0, -3:] = -1  # padding at the end of row 0
            self.seq_idx = s
        self.init = torch.randn(batch, dim, width - 1, generator=gen).to(dtype) if init else None
        self.final = final
        self.activation = "silu" if silu else None
        self.dout = _seq(batch, dim, seqlen, layout, dtype, gen)
        self.dfinal = torch.randn(batch, dim, width - 1, generator=gen).to(dtype) if final else None

    def leaves(self) -> dict[str, torch.Tensor]:
        named = {"x": self.x, "weight": self.weight, "bias": self.bias, "initial_states": self.init}
        return {k: v for k, v in named.items() if v is not None}

    def run(self, fn, leaves: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(out, gradients of (out * dout).sum() + (final * dfinal).sum() for every leaf)."""
        req = {k: v.detach().clone().requires_grad_() for k, v in leaves.items()}
        with torch.enable_grad():
            out, final = fn(req)
            loss = (out.float() * self.dout.float()).sum()
            if self.final:
                loss = loss + (final.float() * self.dfinal.float()).sum()
            grads = torch.autograd.grad(loss, list(req.values()))
        return out.detach(), dict(zip(req, grads, strict=True))

    def kernel(self, req: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        res = causal_conv1d_fn(req["x"], req["weight"], req.get("bias"), self.seq_idx, req.get("initial_states"),
                               return_final_states=self.final, activation=self.activation)
        return res if self.final else (res, None)

    def reference(self, upcast: bool = True):
        def fn(req: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            return causal_conv1d_ref(req["x"], req["weight"], req.get("bias"), self.seq_idx,
                                     req.get("initial_states"), self.activation, upcast=upcast)

        return fn


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_forward_and_every_gradient_match_the_fp32_reference(layout: str, width: int, option: str,
                                                             nan_empty: None) -> None:
    case = Case(layout, width, option)
    out, grads = case.run(case.kernel, case.leaves())
    ref_out, ref_grads = case.run(case.reference(), case.leaves())
    assert out.stride() == case.x.stride(), "the output keeps x's layout"
    assert _err(out, ref_out) < 1e-5
    if case.final:
        _, final = case.kernel({"x": case.x, "weight": case.weight, "bias": case.bias, "initial_states": case.init})
        assert torch.equal(final, case.reference()(case.leaves())[1])
    for name, g in grads.items():
        assert g.shape == case.leaves()[name].shape and g.dtype == case.leaves()[name].dtype, name
        assert _err(g, ref_grads[name]) < 1e-4, f"{name}: max error {_err(g, ref_grads[name]):.2e}"


@pytest.mark.parametrize("seqlen", [1, 2])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_sequence_shorter_than_the_window(layout: str, seqlen: int) -> None:
    # The final states then hold initial states too, and their gradient flows back into them.
    case = Case(layout, 4, "init-final-silu", shape=(2, 3, seqlen))
    out, grads = case.run(case.kernel, case.leaves())
    ref_out, ref_grads = case.run(case.reference(), case.leaves())
    assert _err(out, ref_out) < 1e-5
    for name, g in grads.items():
        assert _err(g, ref_grads[name]) < 1e-4, name


def test_padding_positions_give_zero_and_get_no_gradient() -> None:
    case = Case("channel_last", 4, "seq_idx-pad")
    out, grads = case.run(case.kernel, case.leaves())
    assert torch.all(out[0, :, -3:] == 0)
    assert torch.all(grads["x"][0, :, -3:] == 0)  # their taps reach only padding outputs


def test_seq_idx_restarts_the_conv_at_each_sequence() -> None:
    # The same as convolving each packed sequence on its own (independent of the reference).
    case = Case("channel_last", 3, "seq_idx-bias-silu")
    out = causal_conv1d_fn(case.x, case.weight, case.bias, case.seq_idx, activation="silu")
    for b in range(case.x.shape[0]):
        for s in case.seq_idx[b].unique().tolist():
            pos = (case.seq_idx[b] == s).nonzero().flatten()
            alone = causal_conv1d_fn(case.x[b:b + 1, :, pos], case.weight, case.bias, activation="silu")
            assert _err(out[b:b + 1, :, pos], alone) < 1e-6


@pytest.mark.parametrize("option", ["bias-silu", "seq_idx-bias-silu", "init-final-silu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_low_precision_within_twice_eager_error(layout: str, dtype: torch.dtype, option: str) -> None:
    case = Case(layout, 4, option, dtype=dtype, shape=(2, 8, 40))
    out, grads = case.run(case.kernel, case.leaves())
    ref_out, ref_grads = case.run(case.reference(upcast=True), case.leaves())
    low_out, low_grads = case.run(case.reference(upcast=False), case.leaves())
    atol = 1e-2
    assert out.dtype == dtype
    assert _err(out, ref_out) <= 2 * _err(low_out, ref_out) + atol
    for name, g in grads.items():
        assert g.dtype == dtype, name
        bound = 2 * _err(low_grads[name], ref_grads[name]) + atol * max(1.0, ref_grads[name].abs().max().item())
        assert _err(g, ref_grads[name]) <= bound, name


def test_fp32_weight_with_bf16_inputs() -> None:
    # A bf16 model under autocast keeps fp32 parameters: mixed dtypes, each gradient in its leaf's dtype.
    case = Case("channel_last", 4, "bias-silu", dtype=torch.bfloat16)
    case.weight, case.bias = case.weight.float(), case.bias.float()
    out, grads = case.run(case.kernel, case.leaves())
    ref_out, ref_grads = case.run(case.reference(), case.leaves())
    assert out.dtype == torch.bfloat16 and grads["weight"].dtype == torch.float32
    assert _err(out, ref_out) < 2e-2
    assert _err(grads["weight"], ref_grads["weight"]) < 1e-3 * ref_grads["weight"].abs().max().item() + 1e-3


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
@pytest.mark.parametrize("option", ["bias-silu", "seq_idx-bias-silu", "init-final-silu"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradcheck_fp32(layout: str, option: str) -> None:
    # fp32 finite differences (the kernels accumulate in fp32: fp64 inputs are refused).
    case = Case(layout, 3, option, shape=(1, 3, 7))
    names = list(case.leaves())

    def fn(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        req = dict(zip(names, tensors, strict=True))
        res = causal_conv1d_fn(req["x"], req["weight"], req.get("bias"), case.seq_idx, req.get("initial_states"),
                               return_final_states=case.final, activation=case.activation)
        return res if case.final else (res,)

    inputs = tuple(t.detach().clone().requires_grad_() for t in case.leaves().values())
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-2, atol=2e-3, rtol=2e-2)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_is_bitwise_deterministic(layout: str) -> None:
    case = Case(layout, 4, "init-final-silu", shape=(3, 5, 29))
    first = case.run(case.kernel, case.leaves())[1]
    second = case.run(case.kernel, case.leaves())[1]
    for name in first:
        assert torch.equal(first[name], second[name]), name


@pytest.mark.parametrize("layout", LAYOUTS)
def test_explicit_forward_and_backward(layout: str) -> None:
    # What the fused layer calls: final states into a given buffer, dx into a slice of its own buffer.
    case = Case(layout, 4, "init-final-silu")
    batch, dim, seqlen = case.x.shape
    final = torch.empty(batch, dim, 3)
    out = conv1d_forward(case.x, case.weight, case.bias, None, case.init, final, True)
    ref_out, ref_final = case.reference()(case.leaves())
    assert _err(out, ref_out) < 1e-5 and torch.equal(final, ref_final)
    wide = torch.full((batch, seqlen, dim + 5), float("nan"))
    dx_view = wide[:, :, 2:2 + dim].transpose(1, 2)  # a channel-last slice, as xBC in zxbcdt
    dx, dweight, dbias, dinit = conv1d_backward(case.x, case.weight, case.bias, case.dout, None, case.init,
                                                case.dfinal, dx_view, True, True)
    assert dx is dx_view and not wide[:, :, 2:2 + dim].isnan().any() and wide[:, :, :2].isnan().all()
    _, ref_grads = case.run(case.reference(), case.leaves())
    for name, g in (("x", dx), ("weight", dweight), ("bias", dbias), ("initial_states", dinit)):
        assert _err(g, ref_grads[name]) < 1e-4, name
    _dx, _dw, dbias_none, dinit_none = conv1d_backward(case.x, case.weight, None, case.dout, None, case.init, None,
                                                       None, False, True)
    assert dbias_none is None and dinit_none is None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dx_may_be_written_over_dout(layout: str) -> None:
    # The first kernel reads all of dout (into dpre) before the second writes dx.
    case = Case(layout, 4, "seq_idx-bias-silu")
    dout = case.dout.clone()
    got = conv1d_backward(case.x, case.weight, case.bias, dout, case.seq_idx, None, None, dout, False, True)
    assert got[0] is dout
    # dx over dout takes the two kernels (bwd_slide.fits): the same gradients as they give into a fresh dx.
    dx, dw, db = bwd.two_kernel_backward(case.x, case.weight, case.bias, case.dout, case.seq_idx, None, None,
                                         common.like(case.x), None, 4, True)
    for a, b in zip(got[:3], (dx, dw.t().to(case.weight.dtype), db.to(case.bias.dtype)), strict=True):
        assert torch.equal(a, b)


def test_explicit_api_signatures_are_stable() -> None:
    # The fused layer (mamba_split_conv1d_scan_combined) calls these by position.
    assert list(inspect.signature(conv1d_forward).parameters) == [
        "x", "weight", "bias", "seq_idx", "initial_states", "final_states_out", "silu"]
    assert list(inspect.signature(conv1d_backward).parameters) == [
        "x", "weight", "bias", "dout", "seq_idx", "initial_states", "dfinal_states", "dx", "return_dinitial_states",
        "silu"]


def test_channel_last_strided_view_is_not_copied() -> None:
    # xBC as Mamba2 passes it: a slice of the in_proj output, rearranged to (batch, dim, seqlen).
    gen = torch.Generator().manual_seed(1)
    zxbcdt = torch.randn(2, 11, 20, generator=gen)
    x = zxbcdt[:, :, 4:12].transpose(1, 2)
    assert x.stride(1) == 1 and not x.is_contiguous()
    assert common.strided(x) is x
    weight = torch.randn(8, 4, generator=gen)
    out = causal_conv1d_fn(x, weight, activation="silu")
    assert out.stride(1) == 1 and out.transpose(1, 2).is_contiguous()
    assert _err(out, causal_conv1d_ref(x, weight, activation="silu")[0]) < 1e-5
    dims = fwd._fwd_dims_from_args((x, weight, None, None, None, out, 4, True))
    assert dims["channel_last"] == 1 and dims["dim"] == 8 and dims["seqlen"] == 11


def test_other_strides_are_made_contiguous() -> None:
    x = torch.randn(2, 6, 10)[:, :, ::2]  # seqlen stride 2, dim stride 10: neither unit
    weight = torch.randn(6, 2)
    assert _err(causal_conv1d_fn(x, weight), causal_conv1d_ref(x, weight)[0]) < 1e-5


# --- the shape contract -------------------------------------------------------------------


def _bad_calls() -> list[tuple[str, dict, str]]:
    x = torch.randn(2, 6, 9)
    w = torch.randn(6, 4)
    return [
        ("x-2d", dict(x=torch.randn(6, 9), weight=w), r"x must be \(batch, dim, seqlen\)"),
        ("x-int", dict(x=torch.ones(2, 6, 9, dtype=torch.int32), weight=w), "x dtype"),
        ("x-fp64", dict(x=x.double(), weight=w), "x dtype torch.float64"),
        ("width-5", dict(x=x, weight=torch.randn(6, 5)), "width 5"),
        ("width-1", dict(x=x, weight=torch.randn(6, 1)), "width 1"),
        ("weight-dim", dict(x=x, weight=torch.randn(5, 4)), r"weight must be \(dim, width\) = \(6, width\)"),
        ("weight-3d", dict(x=x, weight=torch.randn(6, 1, 4)), "weight must be"),
        ("bias", dict(x=x, weight=w, bias=torch.randn(5)), r"bias shape \(5,\)"),
        ("seq_idx-shape", dict(x=x, weight=w, seq_idx=torch.zeros(2, 8, dtype=torch.int32)), "seq_idx shape"),
        ("seq_idx-float", dict(x=x, weight=w, seq_idx=torch.zeros(2, 9)), "seq_idx dtype"),
        ("seq_idx-init", dict(x=x, weight=w, seq_idx=torch.zeros(2, 9, dtype=torch.int32),
                              initial_states=torch.randn(2, 6, 3)), "seq_idx cannot be combined"),
        ("seq_idx-final", dict(x=x, weight=w, seq_idx=torch.zeros(2, 9, dtype=torch.int32),
                               return_final_states=True), "seq_idx cannot be combined"),
        ("init-shape", dict(x=x, weight=w, initial_states=torch.randn(2, 6, 4)),
         r"initial_states shape \(2, 6, 4\) != \(batch, dim, width - 1\) = \(2, 6, 3\)"),
        ("final-shape", dict(x=x, weight=w, return_final_states=True, final_states_out=torch.randn(2, 6, 2)),
         "final_states_out shape"),
        ("activation", dict(x=x, weight=w, activation="relu"), "activation 'relu'"),
        ("empty", dict(x=torch.randn(2, 6, 0), weight=w), "empty x"),
    ]


@pytest.mark.parametrize(("kwargs", "match"), [c[1:] for c in _bad_calls()], ids=[c[0] for c in _bad_calls()])
def test_bad_input_is_a_value_error(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        causal_conv1d_fn(**kwargs)


def test_bad_backward_input_is_a_value_error() -> None:
    x, w = torch.randn(2, 6, 9), torch.randn(6, 4)
    cases = [
        (dict(dout=torch.randn(2, 6, 8)), "dout shape"),
        (dict(dfinal_states=torch.randn(2, 6, 4)), "dfinal_states shape"),
        (dict(return_dinitial_states=True), "return_dinitial_states needs initial_states"),
        (dict(dx=torch.empty(2, 6, 9, dtype=torch.bfloat16)), "dx dtype"),
        (dict(dx=torch.empty(2, 6, 18)[:, :, ::2]), "dx strides"),
    ]
    for extra, match in cases:
        args = dict(x=x, weight=w, bias=None, dout=torch.randn(2, 6, 9), seq_idx=None, initial_states=None,
                    dfinal_states=None, dx=None, return_dinitial_states=False, silu=True)
        args.update(extra)
        with pytest.raises(ValueError, match=match):
            conv1d_backward(**args)


def test_runtime_dims_name_every_option() -> None:
    for layout, option in itertools.product(LAYOUTS, OPTIONS):
        case = Case(layout, 3, option)
        fwd_args = (case.x, case.weight, case.bias, case.seq_idx, case.init, common.like(case.x), 3, bool(case.activation))
        dims = fwd._fwd_dims_from_args(fwd_args)
        assert tuple(dims) == fwd.CAUSAL_CONV1D_FWD.dims
        assert dims["channel_last"] == int(layout == "channel_last")
        assert (dims["has_bias"], dims["has_seq_idx"], dims["has_initial_states"], dims["silu"]) == (
            int(case.bias is not None), int(case.seq_idx is not None), int(case.init is not None),
            int(case.activation is not None))
