"""Gated RMSNorm / LayerNorm: numerics against the fp32 reference, shape errors, determinism.

On CPU these run the Helion kernel bodies in ref mode (see conftest.py); the GPU versions
at real sizes are in test_norm_gpu.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from autotune_cli.reference import gated_norm_ref
from mamba_tune import LayerNormGated, RMSNormGated, layernorm_fn, rmsnorm_fn

# (dtype, atol): err(kernel) <= 2 * err(eager torch in dtype) + atol, against fp32.
TOLS = [
    pytest.param(torch.float32, 1e-5, id="fp32"),
    pytest.param(torch.bfloat16, 1e-2, id="bf16"),
    pytest.param(torch.float16, 2e-3, id="fp16"),
]
# (rows, d, group_size): odd row counts, one row, whole-row and grouped, non-pow2 groups.
SHAPES = [
    pytest.param(37, 64, None, id="37x64-whole"),
    pytest.param(1, 96, 32, id="1row-3groups"),
    pytest.param(50, 80, 40, id="50x80-g40"),
    pytest.param(129, 48, 16, id="129x48-g16"),
]
OPTIONS = [
    pytest.param(z, nbg, bias, rms, id=f"{'z' if z else 'noz'}-{'nbg' if nbg else 'gbn'}-"
                 f"{'bias' if bias else 'nobias'}-{'rms' if rms else 'ln'}")
    for z, nbg, bias, rms in itertools.product([True, False], [True, False], [True, False], [True, False])
    if z or nbg  # without z, norm_before_gate has no effect: skip the duplicate
]


def _inputs(rows, d, dtype, wdtype, z, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=g).to(dtype)
    zz = torch.randn(rows, d, generator=g).to(dtype) if z else None
    w = (1 + 0.1 * torch.randn(d, generator=g)).to(wdtype)
    b = (0.1 * torch.randn(d, generator=g)).to(wdtype) if bias else None
    dy = torch.randn(rows, d, generator=g).to(dtype)
    return x, zz, w, b, dy


def _grads(fn, leaves, dy):
    leaves = [t.detach().requires_grad_() if t is not None else None for t in leaves]
    out = fn(*leaves)
    present = [t for t in leaves if t is not None]
    grads = torch.autograd.grad(out, present, dy.to(out.dtype))
    it = iter(grads)
    return out, [next(it) if t is not None else None for t in leaves]


@pytest.mark.parametrize("dtype,atol", TOLS)
@pytest.mark.parametrize("rows,d,group_size", SHAPES)
@pytest.mark.parametrize("has_z,norm_before_gate,has_bias,is_rms", OPTIONS)
@pytest.mark.parametrize("weight_fp32", [True, False], ids=["w32", "wlow"])
def test_forward_backward_matches_reference(
    nan_empty, dtype, atol, rows, d, group_size, has_z, norm_before_gate, has_bias, is_rms, weight_fp32
):
    wdtype = torch.float32 if weight_fp32 else dtype
    x, z, w, b, dy = _inputs(rows, d, dtype, wdtype, has_z, has_bias)
    eps = 1e-6

    def ours(x, z, w, b):
        return layernorm_fn(x, w, b, z=z, eps=eps, group_size=group_size, norm_before_gate=norm_before_gate,
                            is_rms_norm=is_rms)

    def ref(upcast):
        def f(x, z, w, b):
            return gated_norm_ref(x, w, b, z, eps, group_size, norm_before_gate, is_rms, upcast=upcast)
        return f

    out, g = _grads(ours, [x, z, w, b], dy)
    ref_out, ref_g = _grads(ref(True), [t.float() if t is not None else None for t in (x, z, w, b)], dy.float())
    low_out, low_g = _grads(ref(False), [x, z, w, b], dy)

    assert out.dtype == dtype and out.shape == x.shape
    names = ["out", "dx", "dz", "dw", "db"]
    for name, got, want, low in zip(names, [out, *g], [ref_out, *ref_g], [low_out, *low_g]):
        if want is None:
            assert got is None, name
            continue
        assert got.dtype == ([x, z, w, b][names.index(name) - 1].dtype if name != "out" else dtype), name
        err = (got.float() - want.float()).abs().max().item()
        bound = 2 * (low.float() - want.float()).abs().max().item() + atol
        assert err <= bound, f"{name}: err {err:.3g} > bound {bound:.3g}"


def test_modules_match_functions():
    torch.manual_seed(0)
    x, z = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    m = RMSNormGated(64, eps=1e-5, group_size=16, norm_before_gate=False)
    torch.nn.init.normal_(m.weight, 1.0, 0.1)
    want = gated_norm_ref(x, m.weight, None, z, 1e-5, 16, False, True)
    torch.testing.assert_close(m(x, z), want, rtol=1e-5, atol=1e-5)
    ln = LayerNormGated(64, group_size=32)
    torch.testing.assert_close(ln(x, z), gated_norm_ref(x, ln.weight, ln.bias, z, 1e-5, 32, True, False),
                               rtol=1e-5, atol=1e-5)


def test_leading_dims_and_noncontiguous_inputs():
    torch.manual_seed(1)
    x = torch.randn(3, 64, 7).transpose(1, 2)  # (3, 7, 64), non-contiguous
    z = torch.randn(3, 7, 64)
    w = torch.randn(64)
    got = rmsnorm_fn(x, w, None, z, group_size=32)
    torch.testing.assert_close(got, gated_norm_ref(x, w, None, z, 1e-6, 32, True, True), rtol=1e-5, atol=1e-5)


def _spy_kernel_args(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple]:
    """The arguments each norm kernel gets from its launcher (the real runtime still runs)."""
    from mamba_tune.norm import gated

    seen: dict[str, tuple] = {}
    real_run = gated.runtime.run

    def run(rk, args):
        seen[rk.name] = tuple(args)
        return real_run(rk, args)

    monkeypatch.setattr(gated.runtime, "run", run)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_row_strided_inputs_reach_the_kernels_without_a_copy(monkeypatch, dtype):
    # As the Mamba-2 layer calls it: z a column slice of the in_proj output (batch, seqlen,
    # 2 d + extra), x contiguous; in the backward dy a column slice of a larger gradient.
    d, gs, extra = 64, 16, 40
    g = torch.Generator().manual_seed(4)
    proj = torch.randn(2, 9, 2 * d + extra, generator=g).to(dtype)
    z = proj[..., d : 2 * d]
    x = torch.randn(2, 9, d, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(d, generator=g)).float()
    assert not z.is_contiguous()
    seen = _spy_kernel_args(monkeypatch)

    def run(xx, zz):
        leaves = [t.detach().requires_grad_() for t in (xx, zz, w)]
        y = rmsnorm_fn(leaves[0], leaves[2], None, z=leaves[1], eps=1e-5, group_size=gs, norm_before_gate=False)
        wide = torch.cat([y, torch.zeros_like(y)], dim=-1)  # its backward hands y a column slice
        (wide * torch.linspace(-1, 1, 2 * d).to(dtype)).sum().backward()
        return y, [t.grad for t in leaves]

    y, grads = run(x, z)
    fwd_z, bwd_dy, bwd_z = seen["gated_norm_fwd"][1], seen["gated_norm_bwd"][0], seen["gated_norm_bwd"][2]
    # The kernels read z in place (same memory, in_proj's row stride) and dy in place.
    assert fwd_z.data_ptr() == z.data_ptr() and fwd_z.stride() == (2 * d + extra, gs, 1)
    assert bwd_z.data_ptr() == z.data_ptr()
    assert bwd_dy.stride(0) == 2 * d
    y_c, grads_c = run(x, z.contiguous())
    assert seen["gated_norm_fwd"][1].stride() == (d, gs, 1)  # the contiguous run is what it says
    torch.testing.assert_close(y, y_c, rtol=0, atol=0)
    for a, b in zip(grads, grads_c):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_transposed_inputs_are_still_copied_to_rows():
    # A last dim that is not contiguous cannot go to the kernel as rows: one copy, same result.
    x = torch.randn(64, 10).t()  # (10, 64), stride (1, 10)
    z = torch.randn(10, 64)
    w = torch.randn(64)
    torch.testing.assert_close(rmsnorm_fn(x, w, None, z, group_size=32), rmsnorm_fn(x.contiguous(), w, None, z,
                                                                                     group_size=32), rtol=0, atol=0)


@pytest.mark.parametrize("is_rms", [True, False], ids=["rms", "ln"])
def test_forward_allocates_mean_only_for_layernorm(is_rms):
    # RMS calls hand back rstd in mean's place (one allocation less on the host path).
    from mamba_tune.norm.gated import gated_norm_fwd_kernel

    x, z, w, _, _ = _inputs(8, 64, torch.bfloat16, torch.float32, True, False)
    out, mean, rstd = gated_norm_fwd_kernel(x.view(8, 2, 32), z.view(8, 2, 32), w.view(2, 32), None, 1e-6,
                                            True, is_rms)
    assert (mean.data_ptr() == rstd.data_ptr()) == is_rms
    if not is_rms:
        torch.testing.assert_close(mean, x.float().view(8, 2, 32).mean(-1))


@pytest.mark.parametrize("rows,d,group_size", SHAPES)
@pytest.mark.parametrize("has_z,norm_before_gate,has_bias,is_rms", OPTIONS)
def test_backward_recomputing_the_statistics_and_output_matches_the_two_passes(rows, d, group_size, has_z,
                                                                               norm_before_gate, has_bias, is_rms):
    # The fused layer's call: no statistics kept, the forward's output written again in the same
    # pass. It computes what the forward and the backward with the forward's statistics compute.
    from mamba_tune.norm import gated

    gs = d if group_size is None else group_size
    x, z, w, b, dy = _inputs(rows, d, torch.bfloat16, torch.float32, has_z, has_bias, seed=5)
    out, mean, rstd = gated._fwd(x, z, w, b, 1e-5, gs, norm_before_gate, is_rms)
    two = gated._bwd(dy, x, z, w, b, mean, rstd, gs, norm_before_gate, is_rms)
    again = torch.full_like(x, float("nan"))
    one = gated._bwd(dy, x, z, w, b, None, None, gs, norm_before_gate, is_rms, out2=again, eps=1e-5)
    torch.testing.assert_close(again, out, rtol=0, atol=0)
    for a, c in zip(two, one):  # dx, dz, dweight, dbias (None where absent)
        assert (a is None) == (c is None)
        if a is not None:
            torch.testing.assert_close(c, a, rtol=0, atol=0)


def test_backward_recompute_refuses_what_it_cannot_use():
    from mamba_tune.norm import gated

    x, z, w, _, dy = _inputs(8, 64, torch.bfloat16, torch.float32, True, False)
    with pytest.raises(ValueError, match="without rstd, eps is needed"):
        gated._bwd(dy, x, z, w, None, None, None, 32, False, True, out2=torch.empty_like(x))
    with pytest.raises(ValueError, match=r"out must be \(8, 64\) torch.bfloat16 contiguous"):
        gated._bwd(dy, x, z, w, None, None, None, 32, False, True, out2=torch.empty(8, 64), eps=1e-5)


def test_backward_is_bitwise_deterministic():
    x, z, w, b, dy = _inputs(300, 128, torch.bfloat16, torch.float32, True, True, seed=3)
    runs = []
    for _ in range(3):
        _, g = _grads(lambda x, z, w, b: rmsnorm_fn(x, w, b, z, group_size=64, norm_before_gate=False),
                      [x, z, w, b], dy)
        runs.append(g)
    for other in runs[1:]:
        for a, c in zip(runs[0], other):
            assert torch.equal(a, c)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(x=(4, 64), w=(32,)), r"weight shape \(32,\) != \(64,\)"),
        (dict(x=(4, 64), w=(64,), z=(4, 32)), r"z shape \(4, 32\) != x shape \(4, 64\)"),
        (dict(x=(4, 64), w=(64,), group_size=24), r"group_size 24 does not divide d=64"),
        (dict(x=(4, 64), w=(64,), b=(63,)), r"bias must be \(64,\)"),
        (dict(x=(0, 64), w=(64,)), r"non-empty"),
    ],
    ids=["weight", "z", "group_size", "bias", "empty"],
)
def test_bad_shapes_raise_value_error(kwargs, match):
    x = torch.randn(*kwargs["x"])
    w = torch.randn(*kwargs["w"])
    z = torch.randn(*kwargs["z"]) if "z" in kwargs else None
    b = torch.randn(*kwargs["b"]) if "b" in kwargs else None
    with pytest.raises(ValueError, match=match):
        rmsnorm_fn(x, w, b, z, group_size=kwargs.get("group_size"))


def test_bad_dtype_raises_value_error():
    with pytest.raises(ValueError, match="z dtype"):
        rmsnorm_fn(torch.randn(2, 8), torch.randn(8), None, torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="x dtype torch.int32"):
        rmsnorm_fn(torch.ones(2, 8, dtype=torch.int32), torch.randn(8), None)
