"""Gated norm on the GPU at real sizes: numerics vs the fp32 reference and vs mamba-ssm,
determinism, no search at run time, CUDA-graph capture. Run on the device: pytest -m gpu."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

from autotune_cli.benchmarks.common import capture
from autotune_cli.reference import gated_norm_ref
from mamba_tune import layernorm_fn, rmsnorm_fn, runtime

pytestmark = pytest.mark.gpu

try:
    from mamba_ssm.ops.triton import layernorm_gated as mamba_lg
except ImportError:  # pragma: no cover - only on the GPU machine
    mamba_lg = None

# (model, rows, d, group_size): the Mamba-2 mixer's call at batch 2, seqlen 8192, and odd rows.
SHAPES = [
    pytest.param(16384, 4096, 512, id="nano-tp1"),
    pytest.param(16384, 2048, 512, id="nano-tp2"),
    pytest.param(16384, 5120, 5120, id="mamba2-2.7b"),
    pytest.param(16384, 1536, 1536, id="falcon-h1-0.5b"),
    pytest.param(1000, 4096, 512, id="1000rows"),
]


def _case(rows, d, dtype, wdtype, z=True, bias=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, d, device="cuda", generator=g).to(dtype)
    zz = torch.randn(rows, d, device="cuda", generator=g).to(dtype) if z else None
    w = (1 + 0.1 * torch.randn(d, device="cuda", generator=g)).to(wdtype)
    b = (0.1 * torch.randn(d, device="cuda", generator=g)).to(wdtype) if bias else None
    dy = torch.randn(rows, d, device="cuda", generator=g).to(dtype)
    return x, zz, w, b, dy


def _fwd_bwd(fn, x, z, w, b, dy):
    leaves = [t.detach().requires_grad_() if t is not None else None for t in (x, z, w, b)]
    out = fn(*leaves)
    present = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(out, present, dy.to(out.dtype)))
    return [out] + [next(grads) if t is not None else None for t in leaves]


def _check(rows, d, gs, dtype, atol, z, nbg, bias, rms):
    x, zz, w, b, dy = _case(rows, d, dtype, torch.float32, z, bias)

    def ours(x, z, w, b):
        return layernorm_fn(x, w, b, z=z, group_size=gs, norm_before_gate=nbg, is_rms_norm=rms)

    def ref(upcast):
        return lambda x, z, w, b: gated_norm_ref(x, w, b, z, 1e-6, gs, nbg, rms, upcast=upcast)

    got = _fwd_bwd(ours, x, zz, w, b, dy)
    want = _fwd_bwd(ref(True), *[t.float() if t is not None else None for t in (x, zz, w, b)], dy.float())
    low = _fwd_bwd(ref(False), x, zz, w, b, dy)
    for name, g_, r_, l_ in zip(["out", "dx", "dz", "dw", "db"], got, want, low):
        if r_ is None:
            continue
        err = (g_.float() - r_).abs().max().item()
        bound = 2 * (l_.float() - r_).abs().max().item() + atol
        assert err <= bound, f"{name}: {err:.3g} > {bound:.3g}"
    return got


@pytest.mark.parametrize("rows,d,gs", SHAPES)
def test_mixer_call_matches_reference_and_mamba_ssm(rows, d, gs):
    got = _check(rows, d, gs, torch.bfloat16, 1e-2, True, False, False, True)
    if mamba_lg is None:
        pytest.skip("mamba-ssm not importable")
    x, z, w, b, dy = _case(rows, d, torch.bfloat16, torch.float32)
    base = _fwd_bwd(lambda x, z, w, b: mamba_lg.rmsnorm_fn(x, w, b, z=z, group_size=gs, norm_before_gate=False),
                    x, z, w, b, dy)
    for name, ours, theirs in zip(["out", "dx", "dz", "dw"], got, base):
        # Same math in the same precision: within a few bf16 ulps of each other.
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2, msg=name)


@pytest.mark.parametrize("dtype,atol", [(torch.bfloat16, 1e-2), (torch.float16, 2e-3), (torch.float32, 1e-4)],
                         ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("z,nbg,bias,rms", [p for p in itertools.product([True, False], [True, False],
                                                                         [True, False], [True, False]) if p[0] or p[1]])
def test_every_option(dtype, atol, z, nbg, bias, rms):
    _check(3001, 1024, 256, dtype, atol, z, nbg, bias, rms)


def test_backward_bitwise_deterministic():
    x, z, w, b, dy = _case(16384, 4096, torch.bfloat16, torch.float32, bias=True)

    def fn(x, z, w, b):
        return rmsnorm_fn(x, w, b, z=z, group_size=512, norm_before_gate=False)

    first = _fwd_bwd(fn, x, z, w, b, dy)
    for _ in range(3):
        again = _fwd_bwd(fn, x, z, w, b, dy)
        for a, c in zip(first, again):
            assert torch.equal(a, c)


def test_no_search_at_run_time(monkeypatch):
    """An untuned shape with HELION_FORCE_AUTOTUNE=1 still never searches: default config, one warning."""
    import helion.autotuner.base_search as bs

    def forbidden(*a, **k):
        raise AssertionError("autotuner called at run time")

    monkeypatch.setattr(bs.BaseSearch, "autotune", forbidden)
    monkeypatch.setenv("HELION_FORCE_AUTOTUNE", "1")
    runtime.configure(mode="exact")
    try:
        x, z, w, _, dy = _case(777, 640, torch.bfloat16, torch.float32)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                _fwd_bwd(lambda x, z, w, b: rmsnorm_fn(x, w, b, z=z, group_size=320, norm_before_gate=False),
                         x, z, w, None, dy)
        mine = [c for c in caught if issubclass(c.category, runtime.MambaTuneWarning)]
        assert len(mine) == 2, [str(c.message) for c in mine]  # one for fwd, one for bwd
        assert all("mamba-tune tune gated_norm_" in str(c.message) for c in mine)
    finally:
        runtime.configure()


def test_cuda_graph_capture():
    x, z, w, _, dy = _case(16384, 4096, torch.bfloat16, torch.float32)
    xr, zr, wr = (t.detach().requires_grad_() for t in (x, z, w))

    def step():
        out = rmsnorm_fn(xr, wr, None, z=zr, group_size=512, norm_before_gate=False)
        return torch.autograd.grad(out, [xr, zr, wr], dy)

    eager = step()  # compiles and resolves configs outside the capture
    graph, (captured,) = capture(step)
    graph.replay()
    torch.cuda.synchronize()
    for a, c in zip(eager, captured):
        assert torch.equal(a, c)
