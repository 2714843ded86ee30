"""The conv1d backward's slide kernel (bwd_slide.py, channel-last calls) against its two kernels
(bwd.py, every other call): in Helion ref mode on the CPU at every option, width 2-4 and odd sizes
(small blocks: several chunks and channel blocks, a partial last one); compiled on a GPU
(`pytest -m gpu`); its compiled loop's carries and its sm_90 compile on the CPU; which calls
`conv1d_backward` sends to which.

The slide kernel does the two kernels' fp32 operations in their order, so without SiLU dx is theirs
bit for bit; with SiLU, ref mode's torch.sigmoid rounds one position's row (here) and a tile of
positions (there) through different CPU code paths, a few fp32 ulps apart. dweight and dbias group
their positions' partial sums otherwise.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mamba_tune.conv1d import bwd, bwd_slide, common, conv1d_backward

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SLIDE = bwd_slide.CAUSAL_CONV1D_BWD_SLIDE


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


def _case(width: int, option: str, shape: tuple[int, int, int], device: str = "cpu") -> dict:
    bias, seq, init, final, silu = OPTIONS[option]
    g = torch.Generator().manual_seed(width)
    batch, dim, seqlen = shape

    def rows() -> torch.Tensor:  # channel-last
        return torch.randn(batch, seqlen, dim, generator=g).transpose(1, 2).to(device)

    seq_idx = None
    if seq:
        seq_idx = torch.zeros(batch, seqlen, dtype=torch.int32)
        seq_idx[:, seqlen // 3:] = 1
        if option == "seq_idx-pad":
            seq_idx[0, -2:] = -1
        seq_idx = seq_idx.to(device)
    return {"x": rows(), "weight": torch.randn(dim, width, generator=g).to(device),
            "bias": torch.randn(dim, generator=g).to(device) if bias else None, "dout": rows(), "seq_idx": seq_idx,
            "initial_states": torch.randn(batch, dim, width - 1, generator=g).to(device) if init else None,
            "dfinal_states": torch.randn(batch, dim, width - 1, generator=g).to(device) if final else None,
            "return_dinitial_states": init, "silu": silu}


def _both(c: dict) -> tuple[tuple, tuple]:
    """(slide's, the two kernels') (dx, dweight, dbias, dinitial_states): conv1d_backward sends
    these channel-last calls to the slide kernel; the two kernels are called directly."""
    x, weight, bias, width = c["x"], c["weight"], c["bias"], c["weight"].shape[1]
    assert bwd_slide.fits(x, c["dout"], None)
    one = conv1d_backward(x, weight, bias, c["dout"], c["seq_idx"], c["initial_states"], c["dfinal_states"], None,
                          c["return_dinitial_states"], c["silu"])
    dinit = common.dinit_buffer(c["initial_states"]) if c["return_dinitial_states"] else None
    dx, dw, db = bwd.two_kernel_backward(x, weight, bias, c["dout"], c["seq_idx"], c["initial_states"],
                                         c["dfinal_states"], common.like(x), dinit, width, c["silu"])
    two = (dx, dw.t().to(weight.dtype), None if bias is None else db.to(bias.dtype),
           None if dinit is None else dinit[:, :, :width - 1])
    return one, two


@pytest.mark.usefixtures("conv_ref_mode")
@pytest.mark.parametrize("shape", [(2, 20, 37), (2, 3, 2)], ids=["L37-two-channel-blocks", "L2-under-width"])
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("width", [2, 3, 4])
def test_the_slide_kernel_gives_the_two_kernels_gradients(width: int, option: str, shape: tuple[int, int, int]):
    c = _case(width, option, shape)
    (dx, dw, db, dinit), (dx2, dw2, db2, dinit2) = _both(c)
    if c["silu"]:
        assert ((dx - dx2).abs() <= 8 * torch.finfo(torch.float32).eps * dx2.abs() + 1e-6).all()
    else:
        assert torch.equal(dx, dx2)
    assert dx.stride() == c["x"].stride()  # channel-last stays channel-last
    assert (dinit is None) == (dinit2 is None)
    if dinit is not None:
        assert (dinit - dinit2).abs().max() <= 1e-5
    for name, a, b in (("dweight", dw, dw2), ("dbias", db, db2)):
        if b is None:
            assert a is None, name
            continue
        assert (a - b).abs().max() <= 1e-5 * max(b.abs().max().item(), 1.0), name


def test_which_calls_take_the_slide_kernel():
    c = _case(4, "plain", (2, 6, 9))
    x, dout = c["x"], c["dout"]
    assert bwd_slide.fits(x, dout, None)
    assert bwd_slide.fits(x, dout, common.like(x))
    # A slice of a wider (batch, seqlen, width) buffer, as the fused layer hands in: rows still unit-stride.
    wide = torch.empty(2, 9, 10).narrow(2, 2, 6).transpose(1, 2)
    assert bwd_slide.fits(x, dout, wide)
    assert not bwd_slide.fits(x.contiguous(), dout, None)
    assert not bwd_slide.fits(x, dout.contiguous(), None)
    assert not bwd_slide.fits(x, dout, common.like(x).contiguous())
    # dx in dout's memory: programs read dout past their own positions, so the two kernels run.
    assert not bwd_slide.fits(x, dout, dout)


@pytest.mark.usefixtures("conv_ref_mode")
def test_dx_in_douts_memory_takes_the_two_kernels():
    """The fused layer may hand in dx as dout's own memory: the two kernels (whose second reads only
    dpre) give the same gradients as a fresh dx does."""
    c = _case(4, "bias-silu", (2, 6, 29))
    args = (c["x"], c["weight"], c["bias"])
    want = conv1d_backward(*args, c["dout"].clone(), None, None, None, None, False, True)
    dout = c["dout"].clone()
    got = conv1d_backward(*args, dout, None, None, None, dout, False, True)
    assert got[0].data_ptr() == dout.data_ptr()
    for a, b in zip(got[:3], want[:3], strict=True):
        assert ((a - b).abs() <= 8 * torch.finfo(torch.float32).eps * b.abs() + 1e-6).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("option", ["bias-silu", "seq_idx-bias-silu", "init-final-silu"])
def test_the_slide_kernel_on_the_gpu(option: str):
    # Compiled, each kernel's code generation may contract the fp32 operations differently: dx is
    # held to a few fp32 roundings of its scale, the sums to their grouping's rounding.
    c = _case(4, option, (2, 512, 1000), device="cuda")
    one, two = _both(c)
    for name, a, b in zip(("dx", "dweight", "dbias", "dinitial_states"), one, two, strict=True):
        if b is None:
            continue
        assert (a - b).abs().max().item() <= 1e-4 * (1 + b.abs().max().item()), name


@pytest.mark.parametrize("option", ["seq_idx-bias-silu", "init-final-silu"])
def test_the_compiled_step_loop_carries_every_kept_row(option: str):
    """Triton's front end, on the CPU (`autotune_cli.lowering.dropped_loop_carries`): the step loop
    must carry the x, dpre and sequence rows kept from the steps before. It carried only the newest
    of each while they all started as one `zero` (x3 = x2 = x1 = zero): on an H100 dx was off by about
    its own size, while ref mode and Triton's interpreter (both run the loop in Python) agreed with
    the two kernels."""
    import helion

    from autotune_cli import lowering

    bias, seq, init, final, silu = OPTIONS[option]
    b, L, dim, width = 1, 64, 64, 4
    rows = lambda: torch.empty_strided((b, dim, L), (L * dim, 1, dim), dtype=torch.bfloat16)  # noqa: E731
    states = lambda: torch.empty(b, dim, width - 1, dtype=torch.bfloat16)  # noqa: E731
    args = (rows(), torch.empty(dim, width, dtype=torch.bfloat16), torch.empty(dim, dtype=torch.bfloat16), rows(),
            torch.zeros(b, L, dtype=torch.int32) if seq else None, states() if init else None,
            states() if final else None, rows(), states() if init else None, width, silu)
    with lowering.compiled_mode(SLIDE.kernel):
        bound = SLIDE.kernel.bind(args)
        config = helion.Config.from_dict(bwd_slide.default_config(SLIDE.dims_from_args(args)))
        assert lowering.dropped_loop_carries(bound, config, args) == []


_INTERPRET = r"""
import sys, torch, helion
from triton.runtime import interpreter
from autotune_cli.reference.conv1d import causal_conv1d_ref
from mamba_tune.conv1d import bwd_slide
import test_bwd_slide

SLIDE = bwd_slide.CAUSAL_CONV1D_BWD_SLIDE
patch = interpreter._patch_lang_tensor  # Triton 3.6: tl.cast of a Python int is a one-element array


def patched(tensor, scope):
    patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))


interpreter._patch_lang_tensor = patched
launch = lambda k, grid, *a, num_warps, num_stages, **kw: k[grid](*a, num_warps=num_warps, num_stages=num_stages)
for option in sys.argv[1:]:
    c = test_bwd_slide._case(4, option, (1, 48, 70))  # 3 chunks of 32 positions, 2 blocks of 32 channels
    x, w, bias, dout, seq_idx, init, dfinal = (c[k] for k in ("x", "weight", "bias", "dout", "seq_idx",
                                                             "initial_states", "dfinal_states"))
    dx = torch.empty_like(x)
    dinit = None if init is None else torch.empty_like(init)
    args = (x, w, bias, dout, seq_idx, init, dfinal, dx, dinit, 4, c["silu"])
    bound = SLIDE.kernel.bind(args)
    config = helion.Config.from_dict(bwd_slide.slide_config(SLIDE.dims_from_args(args), 32, 32))
    got = bound.compile_config(config, allow_print=False)(*args, _launcher=launch)
    leaves = [t.clone().requires_grad_() for t in (x, w, bias, init) if t is not None]
    names = [n for n, t in zip(("dx", "dweight", "dbias", "dinitial_states"), (x, w, bias, init)) if t is not None]
    it = iter(leaves)
    xr, wr, br, ir = (next(it) if t is not None else None for t in (x, w, bias, init))
    out, final = causal_conv1d_ref(xr, wr, br, seq_idx, ir, "silu" if c["silu"] else None)
    loss = (out * dout).sum() + ((final * dfinal).sum() if dfinal is not None else 0)
    want = dict(zip(names, torch.autograd.grad(loss, leaves)))
    have = {"dx": got[0], "dweight": got[1].t(), "dbias": got[2], "dinitial_states": dinit}
    for name, ref in want.items():
        err = (have[name] - ref).abs().max().item()
        assert err <= 1e-4 * (1 + ref.abs().max().item()), f"{name}: {err:.3e} off"
    print("ok", option, sorted(want))
"""


def test_the_generated_triton_kernel_under_triton_interpreter():
    """The compiled path's Triton kernel, as Helion generates it, run by Triton's interpreter on
    the CPU (TRITON_INTERPRET=1, read when the kernel is generated: a subprocess), against the fp32
    reference: Helion's indexing and masks at partial chunks and channel blocks and the halo rows.
    The interpreter runs the step loop in Python, so the dropped loop carries (above) pass here."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "HELION_INTERPRET"}
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _INTERPRET, "seq_idx-bias-silu", "init-final-silu"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.count("ok ") == 2, (r.stdout + r.stderr)[-3000:]


_COMPILE = r"""
import json, sys, torch, helion
from autotune_cli import lowering
from mamba_tune.conv1d import bwd_slide

SLIDE = bwd_slide.CAUSAL_CONV1D_BWD_SLIDE
b, L, dim, width = 2, 8192, 6144, 4  # Nemotron-3 Nano's xBC at TP 1
rows = lambda: torch.empty_strided((b, dim, L), (L * dim, 1, dim), dtype=torch.bfloat16)
packed = sys.argv[1] == "packed"
seq_idx = torch.zeros(b, L, dtype=torch.int32) if packed else None
args = (rows(), torch.empty(dim, width, dtype=torch.bfloat16), torch.empty(dim, dtype=torch.bfloat16), rows(),
        seq_idx, None, None, rows(), None, width, True)
dims = SLIDE.dims_from_args(args)
bound = SLIDE.kernel.bind(args)
compiled = lowering.compile_for_gpu(bound, helion.Config.from_dict(bwd_slide.default_config(dims)), args)
print(json.dumps({"shared": compiled.metadata.shared, **lowering.ptxas_usage(compiled)}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("packed", ["dense", "packed"])
def test_the_default_config_compiles_to_sm90_without_spills(packed: str):
    """Triton's compiler and ptxas for an H200, on the CPU (`autotune_cli.lowering.compile_for_gpu`):
    the rows kept from the steps before fit in registers (no spills) at Nemotron-3 Nano's xBC."""
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k != "HELION_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _COMPILE, packed], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["spill_stores"] == got["spill_loads"] == 0, got
