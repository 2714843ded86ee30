"""The decoding step `mamba_tune.selective_state_update` (mamba-ssm 2.3.2.post1's `selective_state_update`).

On CPU the kernel runs in Helion ref mode (`ssd_ref_mode`: the smallest block sizes, so the
dstate loop takes one column per step) against two references: the project's fp32
reference (autotune_cli.reference.decode, every option, state_batch_indices included) and
mamba-ssm's own pure-torch `selective_state_update_ref` (no state_batch_indices). Then
mamba-ssm's `Mamba2.step` patched against the same module on mamba-ssm's own torch decode
path, transformers' Mamba-2 decoding step patched against transformers' torch step, the
shape contract, and the default config and seeds lowering to Triton (compiled mode, in a
subprocess). The `gpu` tests compile it for real at model sizes: against the reference and
mamba-ssm's Triton kernel, no sync, the launch cost, CUDA-graph capture, Mamba2.step.

Bound: err(kernel) <= 2 * err(the reference evaluated in the inputs' dtype) + atol, both
against the fp32 reference.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import mamba_ssm_cpu
import pytest
import torch

import mamba_tune
from autotune_cli.reference import selective_state_update_ref
from autotune_cli.tuning.ssd.selective_state_update import DecodeInputs
from mamba_tune.ssd import selective_state_update as ssu_module
from mamba_tune.ssd.selective_state_update import selective_state_update

NEEDS_MAMBA_SSM = pytest.mark.skipif(not mamba_ssm_cpu.installed(),
                                     reason="mamba-ssm is not installed (.ci/run installs it)")
CPU = pytest.mark.usefixtures("ssd_ref_mode")

# Every flag of the kernel's key, off unless a case turns it on.
FLAGS = ("has_D", "has_z", "has_dt_bias", "dt_softplus", "tie_hdim", "has_state_batch_indices", "fp32_state")
# Option sets crossed with the structural cases below: all optional inputs, none, and mixes.
OPTIONS = {
    "all": {"has_D": 1, "has_z": 1, "has_dt_bias": 1, "dt_softplus": 1},
    "none": {},
    "D-softplus": {"has_D": 1, "dt_softplus": 1},
    "z-bias": {"has_z": 1, "has_dt_bias": 1},
}
# (batch, nheads, headdim, ngroups, dstate): odd headdim and dstate < 16, groups of 2 heads, one head.
SHAPES = {"b3-H4-P12-G2-N8": (3, 4, 12, 2, 8), "b2-H1-P16-G1-N16": (2, 1, 16, 1, 16)}
# (x dtype, state dtype, atol)
DTYPES = {"fp32": (torch.float32, torch.float32, 1e-5), "bf16": (torch.bfloat16, torch.bfloat16, 1e-2),
          "bf16-fp32state": (torch.bfloat16, torch.float32, 1e-2)}


def _dims(shape: tuple[int, ...], **flags: int) -> dict[str, int]:
    b, H, P, G, N = shape
    return {"batch": b, "nheads": H, "headdim": P, "ngroups": G, "dstate": N, **dict.fromkeys(FLAGS, 0), **flags}


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _assert_bounded(name: str, got: torch.Tensor, ref: torch.Tensor, low: torch.Tensor, atol: float) -> None:
    assert torch.isfinite(got.float()).all(), f"{name}: non-finite values"
    err, bound = _err(got, ref), 2 * _err(low, ref) + atol
    assert err <= bound, f"{name}: max error {err:.3e} > 2 * eager-{low.dtype} error + atol = {bound:.3e}"


def _check_step(inp: DecodeInputs, atol: float) -> None:
    """Run one step on `inp` (its state updated in place) and check out and the whole state."""
    state0 = inp.state.clone()
    up = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
          for k, v in inp.kwargs().items()}
    ref_out, ref_state = selective_state_update_ref(state0.float(), *(t.float() for t in inp.positional()[1:]),
                                                    **up)
    low_out, low_state = selective_state_update_ref(state0, *inp.positional()[1:], upcast=False, **inp.kwargs())
    out = selective_state_update(*inp.positional(), **inp.kwargs())
    assert out.shape == inp.x.shape and out.dtype == inp.x.dtype
    _assert_bounded("out", out, ref_out, low_out, atol)
    _assert_bounded("state", inp.state, ref_state, low_state, atol)
    # Rows no batch row names (the extra slots, a padding row's) are not touched at all.
    sbi = inp.state_batch_indices
    used = torch.zeros(inp.state.shape[0], dtype=torch.bool)
    used[torch.arange(inp.x.shape[0]) if sbi is None else sbi[sbi >= 0].long()] = True
    assert torch.equal(inp.state[~used], state0[~used])
    if sbi is not None:
        assert torch.equal(out[sbi < 0], torch.zeros_like(out[sbi < 0])), "a padding row's output is not zero"


STRUCTURE = [pytest.param(tie, sbi, id=f"{'tie' if tie else 'untied'}-{sbi}")
             for tie in (True, False) for sbi in ("no-indices", "int32", "int64")]


@CPU
@pytest.mark.parametrize("dtype_id", list(DTYPES))
@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("tie,sbi", STRUCTURE)
def test_matches_the_fp32_reference(tie, sbi, options, dtype_id, nan_empty):
    dtype, state_dtype, atol = DTYPES[dtype_id]
    shape = SHAPES["b3-H4-P12-G2-N8"] if options != "none" else SHAPES["b2-H1-P16-G1-N16"]
    dims = _dims(shape, tie_hdim=int(tie), has_state_batch_indices=int(sbi != "no-indices"),
                 fp32_state=int(state_dtype != dtype), **OPTIONS[options])
    inp = DecodeInputs.make(dims, dtype, "cpu", seed=7)
    if sbi == "int64":
        inp.state_batch_indices = inp.state_batch_indices.long()
    if inp.state_batch_indices is not None:
        assert (inp.state_batch_indices < 0).any()  # a padding slot is exercised
    _check_step(inp, atol)


@CPU
def test_several_steps_carry_the_state():
    dims = _dims((2, 4, 8, 2, 16), has_D=1, has_dt_bias=1, dt_softplus=1, tie_hdim=1)
    inp = DecodeInputs.make(dims, torch.float32, "cpu", seed=3)
    ref_state = inp.state.clone()
    for step in range(3):
        x = torch.randn_like(inp.x)
        ref_out, ref_state = selective_state_update_ref(ref_state, x, *inp.positional()[2:], **inp.kwargs())
        out = selective_state_update(inp.state, x, *inp.positional()[2:], **inp.kwargs())
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5, msg=f"step {step}")
    torch.testing.assert_close(inp.state, ref_state, atol=1e-5, rtol=1e-5)


# --- against mamba-ssm's own reference ---------------------------------------------------


@pytest.fixture
def mamba_ssm_ref() -> Any:
    if not mamba_ssm_cpu.installed():
        pytest.skip("mamba-ssm is not installed (.ci/run installs it)")
    mamba_ssm_cpu.load()
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update_ref as ref

    return ref


def _mamba1_inputs(batch: int, dim: int, dstate: int, seed: int, **present: bool) -> dict[str, Any]:
    """The 2-D form as mamba-ssm's Mamba.step passes it: per-channel A, D and dt_bias."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    return {"state": r(batch, dim, dstate), "x": r(batch, dim), "dt": r(batch, dim) - 3,
            "A": -torch.rand(dim, dstate, generator=gen) * 4, "B": r(batch, dstate), "C": r(batch, dstate),
            "D": r(dim) if present.get("D", True) else None, "z": r(batch, dim) if present.get("z", True) else None,
            "dt_bias": r(dim) * 0.1 if present.get("dt_bias", True) else None,
            "dt_softplus": present.get("softplus", True)}


@CPU
@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("tie", [True, False], ids=["tie", "untied"])
def test_heads_form_matches_mamba_ssms_reference(mamba_ssm_ref, tie, options):
    dims = _dims((3, 4, 12, 2, 8), tie_hdim=int(tie), **OPTIONS[options])
    inp = DecodeInputs.make(dims, torch.float32, "cpu", seed=11)
    theirs = inp.state.clone()
    kw = {k: v for k, v in inp.kwargs().items() if k != "state_batch_indices"}
    expected = mamba_ssm_ref(theirs, *inp.positional()[1:], **kw)
    out = selective_state_update(*inp.positional(), **kw)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(inp.state, theirs, atol=1e-5, rtol=1e-5)


@CPU
@pytest.mark.parametrize("present", [{}, {"D": False, "z": False, "dt_bias": False, "softplus": False}],
                         ids=["all", "none"])
def test_mamba1_2d_form_matches_mamba_ssms_reference(mamba_ssm_ref, present):
    args = _mamba1_inputs(3, 24, 8, seed=5, **present)
    mine = {**args, "state": args["state"].clone()}
    # The project's reference too (functional: from the state before the step).
    ref_out, ref_state = selective_state_update_ref(**mine)
    expected = mamba_ssm_ref(**args)
    out = selective_state_update(**mine)
    assert out.shape == (3, 24)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mine["state"], args["state"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mine["state"], ref_state, atol=1e-5, rtol=1e-5)


# --- the launch: stride-0 views, in-place state, no copies --------------------------------


def _mamba2_step_views(batch: int = 2, H: int = 4, P: int = 8, G: int = 2, N: int = 16) -> dict[str, Any]:
    """The arguments exactly as Mamba2.step builds them: slices of one projection and repeat views."""
    from einops import rearrange, repeat

    zxbcdt = torch.randn(batch, H * P + 2 * G * N + H)
    x, B, C, dt = torch.split(zxbcdt, [H * P, G * N, G * N, H], dim=-1)
    A = -torch.rand(H)
    return {"state": torch.randn(batch, H, P, N), "x": rearrange(x, "b (h p) -> b h p", p=P),
            "dt": repeat(dt, "b h -> b h p", p=P), "A": repeat(A, "h -> h p n", p=P, n=N),
            "B": rearrange(B, "b (g n) -> b g n", g=G), "C": rearrange(C, "b (g n) -> b g n", g=G),
            "D": repeat(torch.rand(H), "h -> h p", p=P), "dt_bias": repeat(torch.randn(H), "h -> h p", p=P),
            "dt_softplus": True}


def test_mamba2_step_views_go_to_the_kernel_as_they_are_and_tie_hdim():
    a = _mamba2_step_views()
    assert a["dt"].stride(-1) == 0 and a["A"].stride()[-2:] == (0, 0) and not a["x"].is_contiguous()
    given = [a["state"], a["x"], a["dt"], a["A"], a["B"], a["C"], a["D"], None, a["dt_bias"]]
    args = ssu_module.kernel_args(*given, True, None)
    # The caller's tensors themselves: no copy, not even a view (the kernel reads element 0
    # of each head's dt, dt_bias and A when tied).
    assert all(got is want for got, want in zip(args[:9], given, strict=True))
    assert args[9:] == (None, True, True)
    # Not tied as soon as one of them varies over headdim (then the kernel reads each element).
    assert ssu_module.kernel_args(a["state"], a["x"], a["dt"].contiguous(), a["A"], a["B"], a["C"], None, None,
                                  a["dt_bias"], True, None)[-1] is False
    assert ssu_module.kernel_args(a["state"], a["x"], a["dt"], a["A"], a["B"], a["C"], None, None,
                                  a["dt_bias"].contiguous(), True, None)[-1] is False
    assert ssu_module.kernel_args(a["state"], a["x"], a["dt"], a["A"].contiguous(), a["B"], a["C"], None, None,
                                  a["dt_bias"], True, None)[-1] is False
    # dt_bias absent: tied on dt and A alone (mamba-ssm 2.3.2.post1's launcher needs dt_bias here).
    assert ssu_module.kernel_args(a["state"], a["x"], a["dt"], a["A"], a["B"], a["C"], None, None, None, True,
                                  None)[-1] is True


@CPU
def test_state_is_updated_where_it_lies_at_any_strides():
    a = _mamba2_step_views()
    # The state as a strided view into a larger cache (headdim and dstate swapped in memory,
    # every other slot of the batch): the step must write through the view.
    cache = torch.randn(4, 4, 16, 8)  # (2 * batch, nheads, dstate, headdim)
    state = cache[::2].transpose(2, 3)
    assert state.shape == a["state"].shape and not state.is_contiguous()
    before = cache.clone()
    expected_out, expected_state = selective_state_update_ref(state.clone(), *[a[k] for k in "x dt A B C".split()],
                                                              D=a["D"], dt_bias=a["dt_bias"], dt_softplus=True)
    out = selective_state_update(state, a["x"], a["dt"], a["A"], a["B"], a["C"], a["D"], dt_bias=a["dt_bias"],
                                 dt_softplus=True)
    torch.testing.assert_close(out, expected_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache[::2].transpose(2, 3), expected_state, atol=1e-5, rtol=1e-5)
    assert torch.equal(cache[1::2], before[1::2])


# --- mamba-ssm's Mamba2.step, patched -----------------------------------------------------


@pytest.fixture
def mamba2_module() -> Iterator[Any]:
    if not mamba_ssm_cpu.installed():
        pytest.skip("mamba-ssm is not installed (.ci/run installs it)")
    mamba_ssm_cpu.load()
    from mamba_ssm.modules import mamba2

    mamba_tune.unpatch_mamba_ssm()
    yield mamba2
    mamba_tune.unpatch_mamba_ssm()


def _steps(module: Any, u: torch.Tensor, batch: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    conv_state, ssm_state = module.allocate_inference_cache(batch, u.shape[1])
    outs = []
    with torch.no_grad():
        for t in range(u.shape[1]):
            out, conv_state, ssm_state = module.step(u[:, t:t + 1], conv_state, ssm_state)
            outs.append(out)
    return outs, ssm_state


@CPU
@pytest.mark.parametrize("ngroups,rmsnorm", [(1, False), (2, True)], ids=["G1-z-in-step", "G2-rmsnorm"])
def test_mamba2_step_patched_matches_mamba_ssm(mamba2_module, monkeypatch, ngroups, rmsnorm):
    """Patched: Mamba2.step runs our kernel. Unpatched: mamba-ssm's own torch decode path
    (its fallback when selective_state_update is None: one group only) or, for ngroups > 1,
    mamba-ssm's `selective_state_update_ref`. The gated norm runs ours in both runs (it is
    not under test here; mamba-ssm's is a Triton kernel)."""
    assert mamba2_module.causal_conv1d_update is None  # the conv step runs in torch on CPU
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update_ref as theirs

    torch.manual_seed(0)
    module = mamba2_module.Mamba2(32, d_state=16, headdim=8, ngroups=ngroups, expand=2, use_mem_eff_path=False,
                                  rmsnorm=rmsnorm, layer_idx=0)
    if rmsnorm:
        module.norm = mamba_tune.RMSNormGated(module.d_ssm, eps=1e-5, group_size=module.d_ssm // ngroups,
                                              norm_before_gate=False)
    u = torch.randn(3, 4, 32)
    with monkeypatch.context() as m:
        m.setattr(mamba2_module, "selective_state_update", None if ngroups == 1 else theirs)
        expected, expected_state = _steps(module, u, 3)
    mamba_tune.patch_mamba_ssm(strict=True)
    assert mamba2_module.selective_state_update is mamba_tune.selective_state_update
    got, state = _steps(module, u, 3)
    for t, (a, b) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"token {t}")
    torch.testing.assert_close(state, expected_state, atol=1e-5, rtol=1e-5)


_TRANSFORMERS = r"""
import sys, torch
import mamba_ssm_cpu; mamba_ssm_cpu.load()
import mamba_tune; mamba_tune.patch_mamba_ssm(strict=True)
from transformers.models.mamba2 import modeling_mamba2  # resolves mamba-ssm's functions at import
step = modeling_mamba2.mamba2_selective_state_update
assert any(c.cell_contents is mamba_tune.selective_state_update for c in step.__closure__ or ()), "not ours"
dev = "cuda" if torch.cuda.is_available() else "cpu"
g = torch.Generator().manual_seed(0)
b, H, P, G, N = 2, 4, 8, 2, 16
r = lambda *s: torch.randn(*s, generator=g).to(dev)
# As Mamba2Mixer's decode calls it: dt (batch, 1, nheads) transposed and expanded, A/D/dt_bias expanded.
state, hs, dt = r(b, H, P, N), r(b, H, P), r(b, 1, H).transpose(1, 2).expand(-1, -1, P)
A, D, dt_bias = (-r(H).abs())[:, None, None].expand(-1, P, N), r(H)[:, None].expand(-1, P), r(H)[:, None].expand(-1, P)
B, C = r(b, G, N), r(b, G, N)
mine, theirs = state.clone(), state.clone()
out = step(mine, hs, dt, A, B, C, D, z=None, dt_bias=dt_bias, dt_softplus=True)
ref = step.__wrapped__(theirs, hs, dt, A, B, C, D, z=None, dt_bias=dt_bias, dt_softplus=True)  # transformers' torch path
torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
print("ok")
"""


@pytest.mark.slow
@NEEDS_MAMBA_SSM
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_transformers_mamba2_decode_runs_ours_when_patched_before_its_import():
    """transformers' Mamba-2 family binds mamba-ssm's `selective_state_update` when its modeling
    module is imported (`use_kernel_func_from_hub_with_fallback`): patched before that, its
    decoding step is ours, and it matches transformers' own torch implementation."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests"),
                                                        *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run([sys.executable, "-c", _TRANSFORMERS], cwd=root, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.split()[-1:] == ["ok"], r.stderr[-3000:]


# --- the shape contract -------------------------------------------------------------------


def _bad_cases() -> list[Any]:
    def case(id_: str, change: dict[str, Any], match: str) -> Any:
        return pytest.param(change, match, id=id_)

    return [
        case("state-2d", {"state": torch.zeros(2, 8)}, r"state must be \(batch, nheads, headdim, dstate\)"),
        case("x-headdim", {"x": torch.zeros(2, 4, 7)}, r"x shape \(2, 4, 7\) != .* = \(2, 4, 8\)"),
        case("dt", {"dt": torch.zeros(2, 4, 9)}, r"dt shape \(2, 4, 9\) != \(batch, nheads, headdim\) = \(2, 4, 8\)"),
        case("A", {"A": torch.zeros(4)}, r"A shape \(4,\) != \(nheads, headdim, dstate\) = \(4, 8, 16\)"),
        case("B-dstate", {"B": torch.zeros(2, 2, 15)}, r"B shape \(2, 2, 15\) != .* = \(2, 2, 16\)"),
        case("ngroups", {"B": torch.zeros(2, 3, 16), "C": torch.zeros(2, 3, 16)},
             "ngroups=3 .* does not divide nheads=4"),
        case("C", {"C": torch.zeros(2, 1, 16)}, r"C shape \(2, 1, 16\) != \(batch, ngroups, dstate\) = \(2, 2, 16\)"),
        case("D", {"D": torch.zeros(4, 7)}, r"D shape \(4, 7\) != \(nheads, headdim\) = \(4, 8\)"),
        case("z", {"z": torch.zeros(2, 4, 9)}, r"z shape \(2, 4, 9\) != .* = \(2, 4, 8\)"),
        case("dt_bias", {"dt_bias": torch.zeros(3, 8)}, r"dt_bias shape \(3, 8\) != \(nheads, headdim\) = \(4, 8\)"),
        case("state-batch", {"state": torch.zeros(1, 4, 8, 16)}, "state batch 1 < x batch 2"),
        case("indices-shape", {"state_batch_indices": torch.zeros(3, dtype=torch.int32)},
             r"state_batch_indices shape \(3,\) != \(batch,\) = \(2,\)"),
        case("indices-dtype", {"state_batch_indices": torch.zeros(2)},
             "state_batch_indices dtype torch.float32 is not int32 or int64"),
        case("x-int", {"x": torch.zeros(2, 4, 8, dtype=torch.int32)}, "x dtype torch.int32 is not one of"),
        case("state-fp64", {"state": torch.zeros(2, 4, 8, 16, dtype=torch.float64)}, "state dtype torch.float64"),
        case("empty", {"x": torch.zeros(0, 4, 8), "dt": torch.zeros(0, 4, 8), "B": torch.zeros(0, 2, 16),
                       "C": torch.zeros(0, 2, 16)}, "empty state"),
        case("device", {"C": torch.zeros(2, 2, 16, device="meta")}, "selective_state_update: C is on meta, x is on cpu"),
    ]


@pytest.mark.parametrize("change,match", _bad_cases())
def test_bad_input_raises_a_clear_value_error(change, match):
    good = {"state": torch.zeros(2, 4, 8, 16), "x": torch.zeros(2, 4, 8), "dt": torch.zeros(2, 4, 8),
            "A": torch.zeros(4, 8, 16), "B": torch.zeros(2, 2, 16), "C": torch.zeros(2, 2, 16)}
    with pytest.raises(ValueError, match=match):
        selective_state_update(**{**good, **change})


# --- the default config lowers to Triton (compiled mode, no GPU) ---------------------------

# (id, dims) at tuning shapes: every flag off and on, tied and not, odd sizes, a model's sizes.
LOWERING = {
    "odd-flags0": _dims((3, 4, 12, 2, 8)),
    "odd-flags1-untied": _dims((3, 4, 12, 2, 8), **{**dict.fromkeys(FLAGS, 1), "tie_hdim": 0}),
    "odd-flags1-tied": _dims((3, 4, 12, 2, 8), **dict.fromkeys(FLAGS, 1)),
    "H1-P64-N128-indices": _dims((1, 1, 64, 1, 128), has_state_batch_indices=1, has_D=1),
    "nemotron3-nano-decode": _dims((8, 64, 64, 8, 128), has_D=1, has_dt_bias=1, dt_softplus=1, tie_hdim=1),
    "mamba2-2.7b-decode-N256": _dims((2, 80, 64, 1, 256), has_D=1, has_dt_bias=1, dt_softplus=1, tie_hdim=1),
}

_WORKER = r"""
import json, sys, torch
from autotune_cli.lowering import triton_source
from autotune_cli.tuning import get
import helion
torch.set_num_threads(1)
tk = get("selective_state_update")
for case_id, dims, dtype in json.loads(sys.stdin.read()):
    try:
        problem = tk.make_problem(dims, getattr(torch, dtype), torch.device("cpu"), 0)
        args = problem.args
        if case_id.endswith("-strided"):  # x and z as slices of a wider projection, int64 indices
            wide = torch.zeros(args[1].shape[0], args[1].numel() // args[1].shape[0] * 2, dtype=args[1].dtype)
            x = wide[:, : wide.shape[1] // 2].unflatten(1, args[1].shape[1:])
            args = (args[0], x, *args[2:7], x, *args[8:9], args[9].long(), *args[10:])
        bound = tk.kernel.bind(args)
        configs = {"helion": bound.config_spec.default_config(), "ours": tk.default_for(bound, dims)}
        for seed in tk.seed_configs(dims):
            configs[f"seed {seed}"] = helion.Config.from_dict(seed)
        bad = []
        for name, config in configs.items():
            code = triton_source(bound, config)
            if "tl.store" not in code:
                bad.append(f"{name}: no store")
        result = {"id": case_id, "ok": not bad, "error": "; ".join(bad)}
    except Exception as e:
        result = {"id": case_id, "ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    print(json.dumps(result), flush=True)
"""


@pytest.fixture(scope="module")
def lowered() -> dict[str, dict[str, Any]]:
    # pytest sets a module fixture up again when pytest-xdist runs another module's test between
    # this module's (CI lowered every case twice, about 40 s each): lower once per process.
    return _lower_cases()


@functools.cache
def _lower_cases() -> dict[str, dict[str, Any]]:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env.pop("HELION_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    cases = [(f"{cid}-{dt}", dims, dt) for cid, dims in LOWERING.items() for dt in ("bfloat16", "float32")]
    cases.append(("odd-flags1-untied-strided", LOWERING["odd-flags1-untied"], "bfloat16"))
    proc = subprocess.run([sys.executable, "-c", _WORKER], input=json.dumps(cases), capture_output=True, text=True,
                          env=env, timeout=900, cwd=root)
    results = {r["id"]: r for r in map(json.loads, filter(lambda s: s.startswith("{"), proc.stdout.splitlines()))}
    if proc.returncode != 0:
        results["__worker__"] = {"ok": False, "error": proc.stderr[-3000:]}
    return results


LOWERING_IDS = [f"{cid}-{dt}" for cid in LOWERING for dt in ("bfloat16", "float32")] + ["odd-flags1-untied-strided"]


@pytest.mark.slow
@pytest.mark.xdist_group("selective-state-update-lowering")  # one worker runs `lowered` once
@pytest.mark.parametrize("case_id", LOWERING_IDS)
def test_default_config_and_seeds_lower(lowered, case_id):
    assert "__worker__" not in lowered, lowered["__worker__"]["error"]
    assert case_id in lowered, f"{case_id}: the lowering worker printed no result"
    assert lowered[case_id]["ok"], f"{case_id}: {lowered[case_id]['error']}"


# --- GPU: compiled, at model sizes (`pytest -m gpu`) ---------------------------------------

# (batch, nheads, headdim, ngroups, dstate): Nemotron-3 Nano and Mamba2-2.7B's decode.
MODEL_SHAPES = [pytest.param((8, 64, 64, 8, 128), id="nemotron3-nano-b8"),
                pytest.param((1, 80, 64, 1, 128), id="mamba2-2.7b-b1"),
                pytest.param((64, 80, 64, 1, 128), id="mamba2-2.7b-b64")]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", MODEL_SHAPES)
@pytest.mark.parametrize("dtype_id", ["bf16", "bf16-fp32state", "fp32"])
@pytest.mark.parametrize("flags", [{"has_D": 1, "has_dt_bias": 1, "dt_softplus": 1, "tie_hdim": 1},
                                   {**dict.fromkeys(FLAGS, 1), "tie_hdim": 0}], ids=["mamba2-step", "all-untied"])
@pytest.mark.usefixtures("nan_empty")
def test_gpu_matches_the_fp32_reference(shape, dtype_id, flags):
    dtype, state_dtype, atol = DTYPES[dtype_id]
    # fp32: the kernel sums dstate (128 here) in another order than the reference's einsum.
    atol = max(atol, 1e-4)
    flags = {**flags, "fp32_state": int(state_dtype != dtype)}
    inp = DecodeInputs.make(_dims(shape, **flags), dtype, "cuda", seed=1)
    _check_step_gpu(inp, atol)


def _check_step_gpu(inp: DecodeInputs, atol: float) -> None:
    state0 = inp.state.clone()
    up = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
          for k, v in inp.kwargs().items()}
    ref_out, ref_state = selective_state_update_ref(state0.float(), *(t.float() for t in inp.positional()[1:]),
                                                    **up)
    low_out, low_state = selective_state_update_ref(state0, *inp.positional()[1:], upcast=False, **inp.kwargs())
    out = selective_state_update(*inp.positional(), **inp.kwargs())
    _assert_bounded("out", out, ref_out, low_out, atol)
    _assert_bounded("state", inp.state, ref_state, low_state, atol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", MODEL_SHAPES)
def test_gpu_matches_mamba_ssms_triton_kernel_and_does_not_sync(shape):
    """Within mamba-ssm's own error (both against fp32), and the call never syncs with the GPU."""
    try:
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update as theirs
    except ImportError:
        pytest.skip("mamba-ssm's Triton kernel is not importable")
    dims = _dims(shape, has_D=1, has_dt_bias=1, dt_softplus=1, tie_hdim=1)
    inp = DecodeInputs.make(dims, torch.bfloat16, "cuda", seed=2)
    state0 = inp.state.clone()
    up = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
          for k, v in inp.kwargs().items()}
    ref_out, ref_state = selective_state_update_ref(state0.float(), *(t.float() for t in inp.positional()[1:]),
                                                    **up)
    their_state = state0.clone()
    their_out = theirs(their_state, *inp.positional()[1:], **inp.kwargs())
    selective_state_update(state0.clone(), *inp.positional()[1:], **inp.kwargs())  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = selective_state_update(*inp.positional(), **inp.kwargs())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _assert_bounded("out", out, ref_out, their_out, 1e-2)
    _assert_bounded("state", inp.state, ref_state, their_state, 1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_mamba2_step_patched_matches_mamba_ssm(mamba2_module):
    """mamba-ssm's Mamba2 decoding a few tokens in bf16: patched (our decode step and norm)
    against unpatched (mamba-ssm's Triton kernels), both against nothing else: they must agree
    to bf16 rounding."""
    torch.manual_seed(0)
    module = mamba2_module.Mamba2(1024, d_state=128, headdim=64, ngroups=8, use_mem_eff_path=False, layer_idx=0,
                                  device="cuda", dtype=torch.bfloat16)
    u = torch.randn(4, 3, 1024, device="cuda", dtype=torch.bfloat16)
    expected, expected_state = _steps(module, u, 4)
    mamba_tune.patch_mamba_ssm(strict=True)
    got, state = _steps(module, u, 4)
    for t, (a, b) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(a, b, atol=3e-2, rtol=3e-2, msg=f"token {t}")
    torch.testing.assert_close(state, expected_state, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", MODEL_SHAPES[:2])
def test_gpu_launch_costs_no_more_than_mamba_ssms(shape, capsys):
    """A decoding step is host-bound: back-to-back calls (no sync) measure the launch. Ours
    (checks, runtime lookup, Helion's launcher) within 2x of mamba-ssm's Triton launcher."""
    import time

    try:
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update as theirs
    except ImportError:
        pytest.skip("mamba-ssm's Triton kernel is not importable")
    inp = DecodeInputs.make(_dims(shape, has_D=1, has_dt_bias=1, dt_softplus=1, tie_hdim=1), torch.bfloat16, "cuda",
                            seed=4)

    def per_call_us(fn: Any, n: int = 500) -> float:
        for _ in range(20):
            fn(*inp.positional(), **inp.kwargs())
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn(*inp.positional(), **inp.kwargs())
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        return best

    ours, base = per_call_us(selective_state_update), per_call_us(theirs)
    with capsys.disabled():
        print(f"\nselective_state_update {shape}: {ours:.1f} us per call, mamba-ssm {base:.1f} us")
    assert ours <= 2 * base, f"ours {ours:.1f} us per call > 2 x mamba-ssm's {base:.1f} us"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_step_captures_in_a_cuda_graph():
    """mamba-ssm's generation (`decode(..., cg=True)`) captures the decoding step in a CUDA
    graph: after a warm-up call (the compile), ours captures and each replay steps the state
    as eager calls do."""
    dims = _dims((4, 64, 64, 8, 128), has_D=1, has_dt_bias=1, dt_softplus=1, tie_hdim=1)
    inp = DecodeInputs.make(dims, torch.bfloat16, "cuda", seed=6)
    eager_state = inp.state.clone()
    selective_state_update(eager_state.clone(), *inp.positional()[1:], **inp.kwargs())  # compile
    torch.cuda.synchronize()
    graph_state = inp.state.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        selective_state_update(graph_state.clone(), *inp.positional()[1:], **inp.kwargs())
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = selective_state_update(graph_state, *inp.positional()[1:], **inp.kwargs())
    for step in range(3):
        graph.replay()
        eager_out = selective_state_update(eager_state, *inp.positional()[1:], **inp.kwargs())
        torch.testing.assert_close(graph_out, eager_out, atol=0, rtol=0, msg=f"step {step}")
    torch.testing.assert_close(graph_state, eager_state, atol=0, rtol=0)
