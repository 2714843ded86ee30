"""mamba-ssm's fused layer (`mamba_split_conv1d_scan_combined`) as the layer tests call it.

`grads` runs a layer function forward and backward; `mamba_ssm_grads` does so for mamba-ssm
2.3.2.post1's fused function, working around a bug of its backward (below); `cpu_fused` makes
that function run on CPU. The GPU test (test_layer_gpu.py) compares ours with mamba-ssm's
on an H200 through these; test_mamba_ssm_fused.py runs the same comparison on CPU.

mamba-ssm's bug: without a norm weight and with d_mlp > 0 (its d_nonssm), its backward
returns out_proj's weight gradient for the SSM columns only, (out_dim, dim) instead of
(out_dim, d_mlp + dim): the no-norm branch computes it from the SSD's recomputed output alone
and leaves out the SwiGLU part it recomputed just before (the norm branch uses both).
Autograd then raises ("returned an invalid gradient ... expected shape compatible with").
With d_mlp > 0 and no out_proj its backward fails with or without a norm: it reads
`out0_recompute`, which is only set when there is an out_proj. Its forward is right on
every path.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import mamba_ssm_cpu
import pytest
import torch
import torch.nn.functional as F
from layer_inputs import Layer

from autotune_cli.reference import (
    causal_conv1d_ref,
    gated_norm_ref,
    split_conv1d_scan_ref,
    ssd_chunked_ref,
)

Grads = dict[str, torch.Tensor]

# The options the GPU test compares with mamba-ssm at Nemotron-3 Nano's dims (test_layer_gpu.py),
# and test_mamba_ssm_fused.py at small ones on CPU: (Layer.make options, with a final_states gradient).
OPTIONS = [
    pytest.param({}, False, id="mamba2-default"),
    pytest.param({"seq_idx": True, "initial_states": True}, True, id="seq_idx-init-dfinal"),
    pytest.param({"norm_before_gate": True, "D_per_head": False}, False, id="norm-before-gate-D-hdim"),
    pytest.param({"rmsnorm": False, "d_mlp": 256}, False, id="no-norm-d_mlp"),
]


def grads(fn: Any, layer: Layer, dout: torch.Tensor, dfinal: torch.Tensor | None, **overrides: Any) -> Grads:
    """fn's out and final_states, and the gradient of every tensor input for (dout, dfinal);
    `overrides` replace keyword arguments of the call (they get no gradient)."""
    leaves = layer.leaves()
    args, kw = layer.call_args(leaves)
    out, final = fn(*args, return_final_states=True, **{**kw, **overrides})
    roots, douts = [out], [dout.to(out.dtype)]
    if dfinal is not None:
        roots.append(final)
        douts.append(dfinal)
    got = torch.autograd.grad(roots, list(leaves.values()), douts)
    return {"out": out.detach(), "final_states": final.detach(), **dict(zip(leaves, got, strict=True))}


def reference_grads(layer: Layer, dout: torch.Tensor, dfinal: torch.Tensor | None) -> Grads:
    """`grads` of the fp32 reference (autograd through split_conv1d_scan_ref, inputs upcast)."""
    up = Layer({k: None if v is None else v.float() for k, v in layer.tensors.items()}, layer.seq_idx,
               layer.kwargs, layer.chunk_size)

    def ref(*args: Any, return_final_states: bool, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return split_conv1d_scan_ref(*args, upcast=True, **kw)

    return grads(ref, up, dout.float(), dfinal)


def _skips_outproj_weight_gradient(layer: Layer) -> bool:
    """The calls whose out_proj weight gradient mamba-ssm gets wrong (the module docstring)."""
    t = layer.tensors
    zxbcdt, conv1d_weight, A = t["zxbcdt"], t["conv1d_weight"], t["A"]
    assert zxbcdt is not None and conv1d_weight is not None and A is not None
    nheads = A.shape[0]
    headdim = layer.kwargs["headdim"] or t["D"].shape[1]
    # zxbcdt: [z0 x0 (d_mlp each) | z (dim) | xBC (conv_dim) | dt (nheads)]
    d_mlp = (zxbcdt.shape[-1] - nheads * headdim - conv1d_weight.shape[0] - nheads) // 2
    return t["rmsnorm_weight"] is None and t["outproj_weight"] is not None and d_mlp > 0


def mamba_ssm_grads(fn: Any, layer: Layer, dout: torch.Tensor, dfinal: torch.Tensor | None) -> Grads:
    """`grads` of mamba-ssm's fused function fn. Where its out_proj weight gradient has the
    wrong shape (the module docstring), out_proj's weight is passed without requires_grad,
    so autograd never asks for that gradient (every other one is mamba-ssm's), and the weight
    gradient is what its backward computes on its other path: einsum(dout, the layer's output
    before out_proj) in the inputs' dtype, that output from fn's forward without out_proj."""
    if not _skips_outproj_weight_gradient(layer):
        return grads(fn, layer, dout, dfinal)
    weight = layer.tensors["outproj_weight"]
    assert weight is not None
    frozen = Layer({**layer.tensors, "outproj_weight": None}, layer.seq_idx, layer.kwargs, layer.chunk_size)
    got = grads(fn, frozen, dout, dfinal, outproj_weight=weight.detach())
    dtype = got["out"].dtype
    with torch.no_grad():
        args, kw = frozen.call_args(frozen.leaves())
        before_proj = fn(*args, **{**kw, "outproj_weight": None, "outproj_bias": None})
    dweight = torch.einsum("bso,bsd->od", dout.to(dtype), before_proj.to(dtype)).to(weight.dtype)
    return {**got, "outproj_weight": dweight}


def assert_bounded(name: str, ours: torch.Tensor, ref: torch.Tensor, theirs: torch.Tensor, atol: float) -> None:
    """err(ours) <= 2 * err(theirs) + atol * max(1, max |ref|), both against ref."""
    assert ours.shape == ref.shape == theirs.shape, f"{name}: shapes {ours.shape}, {ref.shape}, {theirs.shape}"
    assert not ours.isnan().any(), f"{name}: NaN"
    err = (ours.float() - ref.float()).abs().max().item()
    bound = 2 * (theirs.float() - ref.float()).abs().max().item() + atol * max(1.0, ref.abs().max().item())
    assert err <= bound, f"{name}: max error {err:.3e} > 2 * mamba-ssm's error + atol = {bound:.3e}"


# --- mamba-ssm's fused function on CPU ------------------------------------------------------
# Its forward and backward (the Python glue: the splits, which buffers are written, what is
# recomputed and returned) run as mamba-ssm wrote them; the leaves that need CUDA or Triton
# are swapped for torch stand-ins that compute in fp32, round their results to the inputs'
# dtype and write into the buffers the glue hands them, as the real kernels do. The stand-ins
# are the project's fp32 references and the SwiGLU's formula: the glue's semantics are
# mamba-ssm's own, its numbers those of exact leaves rounded once, not of its kernels.

Opt = torch.Tensor | None


def _autograd(fn: Any, inputs: dict[str, Opt], douts: list[Opt]) -> dict[str, Opt]:
    """Gradients of fn's outputs for douts (None: an unused output) over fp32 copies of the
    inputs, in fp32; None where an input is None."""
    leaves = {k: None if v is None else v.detach().float().requires_grad_() for k, v in inputs.items()}
    live = [k for k, v in leaves.items() if v is not None]
    with torch.enable_grad():  # the stand-ins run inside a backward, where autograd is off
        outs = fn(**leaves)
        roots = [(o, g.float()) for o, g in zip(outs, douts, strict=True) if g is not None]
        got = torch.autograd.grad([o for o, _ in roots], [leaves[k] for k in live], [g for _, g in roots],
                                  allow_unused=True)
    result: dict[str, Opt] = dict.fromkeys(inputs)
    for k, g in zip(live, got, strict=True):
        leaf = leaves[k]
        assert leaf is not None
        result[k] = torch.zeros_like(leaf) if g is None else g
    return result


def _cast(t: Opt, like: Opt) -> Opt:
    return None if t is None or like is None else t.to(like.dtype)


def _write(buf: Opt, value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """value in like's dtype, written into buf where the glue handed one."""
    value = value.to(like.dtype)
    if buf is None:
        return value
    buf.copy_(value.reshape(buf.shape))
    return buf


def _conv_fwd(x: torch.Tensor, weight: torch.Tensor, bias: Opt, seq_idx: Opt, initial_states: Opt,
              final_states_out: Opt, silu: bool) -> torch.Tensor:
    assert initial_states is None and final_states_out is None
    return causal_conv1d_ref(x, weight, bias, seq_idx, None, "silu" if silu else None)[0]


def _conv_bwd(x: torch.Tensor, weight: torch.Tensor, bias: Opt, dout: torch.Tensor, seq_idx: Opt,
              initial_states: Opt, dfinal_states: Opt, dx: Opt, return_dinitial_states: bool,
              silu: bool) -> tuple[Opt, ...]:
    assert initial_states is None and dfinal_states is None and not return_dinitial_states

    def f(x: torch.Tensor, weight: torch.Tensor, bias: Opt) -> tuple[torch.Tensor]:
        return (causal_conv1d_ref(x, weight, bias, seq_idx, None, "silu" if silu else None)[0],)

    g = _autograd(f, {"x": x, "weight": weight, "bias": bias}, [dout])
    assert g["x"] is not None
    return _write(dx, g["x"], x), _cast(g["weight"], weight), _cast(g["bias"], bias), None


def _ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
         D: Opt, z: Opt, dt_bias: Opt, initial_states: Opt, seq_idx: Opt, dt_limit: tuple[float, float]
         ) -> tuple[torch.Tensor, torch.Tensor]:
    up = [None if t is None else t.float() for t in (x, dt, B, C, D, z, dt_bias, initial_states)]
    x, dt, B, C, D, z, dt_bias, initial_states = up
    assert x is not None and dt is not None and B is not None and C is not None
    return ssd_chunked_ref(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                           seq_idx=seq_idx, dt_softplus=True, dt_limit=dt_limit)


def _ssd_fwd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             chunk_size: int, D: Opt = None, z: Opt = None, dt_bias: Opt = None, initial_states: Opt = None,
             seq_idx: Opt = None, cu_seqlens: Opt = None, dt_softplus: bool = False,
             dt_limit: tuple[float, float] = (0.0, float("inf"))) -> tuple[Opt, ...]:
    """(out (gated by z), out_x (not gated), dt, dA_cumsum, states, final_states): the glue
    reads out, out_x and final_states only."""
    assert dt_softplus and cu_seqlens is None
    out_x, final = _ssd(x, dt, A, B, C, chunk_size, D, None, dt_bias, initial_states, seq_idx, dt_limit)
    out = out_x if z is None else out_x * F.silu(z.float())
    return out.to(x.dtype), out_x.to(x.dtype), None, None, None, final


def _ssd_bwd(dout: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, out: torch.Tensor, chunk_size: int, D: Opt = None, z: Opt = None, dt_bias: Opt = None,
             initial_states: Opt = None, dfinal_states: Opt = None, seq_idx: Opt = None, dt_softplus: bool = False,
             dt_limit: tuple[float, float] = (0.0, float("inf")), dx: Opt = None, ddt: Opt = None, dB: Opt = None,
             dC: Opt = None, dz: Opt = None, recompute_output: bool = False) -> tuple[Opt, ...]:
    """(dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states), then with recompute_output
    the gated output (what the glue hands out_proj's weight gradient)."""
    assert dt_softplus

    def f(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: Opt, z: Opt,
          dt_bias: Opt, initial_states: Opt) -> tuple[torch.Tensor, torch.Tensor]:
        return _ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit)

    g = _autograd(f, {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dt_bias,
                      "initial_states": initial_states}, [dout, dfinal_states])
    gx, gdt, gB, gC = g["x"], g["dt"], g["B"], g["C"]
    assert gx is not None and gdt is not None and gB is not None and gC is not None
    vals = (_write(dx, gx, x), _write(ddt, gdt, dt), _cast(g["A"], A), _write(dB, gB, B), _write(dC, gC, C),
            _cast(g["D"], D), None if z is None or g["z"] is None else _write(dz, g["z"], z),
            _cast(g["dt_bias"], dt_bias), _cast(g["initial_states"], initial_states))
    if not recompute_output:
        return vals
    return (*vals, _ssd_fwd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, None, True,
                            dt_limit)[0])


def _swiglu(xy: torch.Tensor) -> tuple[torch.Tensor]:
    z0, x0 = xy.chunk(2, dim=-1)
    return (F.silu(z0) * x0,)


def _swiglu_fwd(xy: torch.Tensor, out: Opt = None) -> torch.Tensor:
    return _write(out, _swiglu(xy.float())[0], xy)


def _swiglu_bwd(xy: torch.Tensor, dout: torch.Tensor, dxy: Opt = None, recompute_output: bool = False,
                out: Opt = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    g = _autograd(_swiglu, {"xy": xy}, [dout])["xy"]
    assert g is not None
    dxy = _write(dxy, g, xy)
    return (dxy, _swiglu_fwd(xy, out)) if recompute_output else dxy


def _layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor, bias: Opt, eps: float, z: Opt = None, out: Opt = None,
                    group_size: int | None = None, norm_before_gate: bool = True, is_rms_norm: bool = False
                    ) -> tuple[torch.Tensor, Opt, torch.Tensor]:
    """(out, mean, rstd); the glue only hands mean and rstd back to _layer_norm_bwd, which recomputes."""
    y = gated_norm_ref(x.float(), weight.float(), None if bias is None else bias.float(),
                       None if z is None else z.float(), eps, group_size, norm_before_gate, is_rms_norm)
    return _write(out, y, x), None, torch.zeros(1)


def _layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: Opt, eps: float, mean: Opt,
                    rstd: Opt, z: Opt = None, group_size: int | None = None, norm_before_gate: bool = True,
                    is_rms_norm: bool = False, recompute_output: bool = False, dz: Opt = None, out: Opt = None
                    ) -> tuple[Opt, ...]:
    def f(x: torch.Tensor, weight: torch.Tensor, bias: Opt, z: Opt) -> tuple[torch.Tensor]:
        return (gated_norm_ref(x, weight, bias, z, eps, group_size, norm_before_gate, is_rms_norm),)

    g = _autograd(f, {"x": x, "weight": weight, "bias": bias, "z": z}, [dy])
    vals = (_cast(g["x"], x), _cast(g["weight"], weight), _cast(g["bias"], bias),
            None if z is None or g["z"] is None else _write(dz, g["z"], z))
    if not recompute_output:
        return vals
    return (*vals, _layer_norm_fwd(x, weight, bias, eps, z, out, group_size, norm_before_gate, is_rms_norm)[0])


@contextlib.contextmanager
def cpu_fused(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """mamba-ssm's `mamba_split_conv1d_scan_combined` with the CPU stand-ins, for the block
    (the stand-ins are undone by monkeypatch, the Mamba-1 stub its import chain needs on exit)."""
    if not mamba_ssm_cpu.installed():
        pytest.skip("mamba-ssm is not installed (.ci/run installs it)")
    mamba_ssm_cpu.load()
    with mamba_ssm_cpu.mamba1_importable():
        ssd_combined = importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
        leaves = {"causal_conv1d_fwd_function": _conv_fwd, "causal_conv1d_bwd_function": _conv_bwd,
                  "_mamba_chunk_scan_combined_fwd": _ssd_fwd, "_mamba_chunk_scan_combined_bwd": _ssd_bwd,
                  "_swiglu_fwd": _swiglu_fwd, "_swiglu_bwd": _swiglu_bwd, "_layer_norm_fwd": _layer_norm_fwd,
                  "_layer_norm_bwd": _layer_norm_bwd}
        for name, fn in leaves.items():
            assert hasattr(ssd_combined, name), f"mamba-ssm's ssd_combined has no {name} (another version?)"
            monkeypatch.setattr(ssd_combined, name, fn)
        yield ssd_combined.mamba_split_conv1d_scan_combined
