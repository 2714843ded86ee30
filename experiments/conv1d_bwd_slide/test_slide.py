"""The slide conv1d backward (slide.py) against the runtime's two kernels: in Helion ref mode on the
CPU at every option, width 2-4 and odd sizes (small blocks: several chunks and channel blocks, a
partial last one); compiled on a GPU (`pytest -m gpu`); the timing script without a GPU exits 2.

The slide kernel does the two kernels' fp32 operations in their order, so without SiLU dx is theirs
bit for bit; with SiLU, ref mode's torch.sigmoid rounds one position's row (here) and a tile of
positions (there) through different CPU code paths, a few fp32 ulps apart. dweight and dbias group
their positions' partial sums otherwise.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import helion.language as hl
import pytest
import slide
import torch

from mamba_tune.conv1d import conv1d_backward

HERE = Path(__file__).resolve().parent
SMALL_BLOCKS = (8, 3)  # (positions per program, channels per row) for slide; (chunk, step) for the two


@pytest.fixture
def small_blocks() -> Iterator[None]:
    """Ref mode's register_block_size answers 8, then 3, in turn (at most the range)."""
    calls = itertools.count()

    def small(min_or_max: int, max_or_none: int | None = None, /) -> int:
        lo, hi = (1, min_or_max) if max_or_none is None else (min_or_max, max_or_none)
        return max(lo, min(SMALL_BLOCKS[next(calls) % 2], hi))

    saved = hl.register_block_size._ref_fn
    hl.register_block_size._ref_fn = small
    try:
        yield
    finally:
        hl.register_block_size._ref_fn = saved


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
    two = conv1d_backward(c["x"], c["weight"], c["bias"], c["dout"], c["seq_idx"], c["initial_states"],
                          c["dfinal_states"], None, c["return_dinitial_states"], c["silu"])
    one = slide.conv1d_backward_slide(c["x"], c["weight"], c["bias"], c["dout"], c["seq_idx"], c["initial_states"],
                                      c["dfinal_states"], c["return_dinitial_states"], c["silu"])
    return one, two


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("shape", [(2, 6, 29), (2, 3, 2)], ids=["L29", "L2-under-width"])
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


def test_rows_must_be_unit_stride():
    c = _case(4, "plain", (2, 6, 9))
    with pytest.raises(ValueError, match="slide: x and dout must be channel-last"):
        slide.conv1d_backward_slide(c["x"].contiguous(), c["weight"], None, c["dout"], None, None, None, False, True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.xfail(strict=True, reason="compiled, its dx was off by about its own size on an H100 (experiments/"
                                       "README.md); the dropped loop carries behind it are fixed but not yet rerun "
                                       "on a GPU: strict, so the fix shows (then delete this mark)")
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


def test_the_timing_script_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = subprocess.run([sys.executable, str(HERE / "time_slide.py")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().endswith("needs a CUDA GPU"), r.stderr


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
    with lowering.compiled_mode(slide.SLIDE.kernel):
        bound = slide.SLIDE.kernel.bind(args)
        config = helion.Config.from_dict(slide.default_config(slide.SLIDE.dims_from_args(args)))
        assert lowering.dropped_loop_carries(bound, config, args) == []


_INTERPRET = r"""
import sys, torch, helion
from triton.runtime import interpreter
from autotune_cli.reference.conv1d import causal_conv1d_ref
import slide, test_slide

patch = interpreter._patch_lang_tensor  # Triton 3.6: tl.cast of a Python int is a one-element array


def patched(tensor, scope):
    patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))


interpreter._patch_lang_tensor = patched
launch = lambda k, grid, *a, num_warps, num_stages, **kw: k[grid](*a, num_warps=num_warps, num_stages=num_stages)
for option in sys.argv[1:]:
    c = test_slide._case(4, option, (1, 48, 70))  # 3 chunks of 32 positions, 2 blocks of 32 channels
    x, w, bias, dout, seq_idx, init, dfinal = (c[k] for k in ("x", "weight", "bias", "dout", "seq_idx",
                                                             "initial_states", "dfinal_states"))
    dx = torch.empty_like(x)
    dinit = None if init is None else torch.empty_like(init)
    args = (x, w, bias, dout, seq_idx, init, dfinal, dx, dinit, 4, c["silu"])
    bound = slide.SLIDE.kernel.bind(args)
    config = helion.Config.from_dict(slide.slide_config(slide.SLIDE.dims_from_args(args), 32, 32))
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
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _INTERPRET, "seq_idx-bias-silu", "init-final-silu"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.count("ok ") == 2, (r.stdout + r.stderr)[-3000:]


_COMPILE = r"""
import json, sys, torch, helion
from autotune_cli import lowering
import slide

b, L, dim, width = 2, 8192, 6144, 4  # Nemotron-3 Nano's xBC at TP 1
rows = lambda: torch.empty_strided((b, dim, L), (L * dim, 1, dim), dtype=torch.bfloat16)
packed = sys.argv[1] == "packed"
seq_idx = torch.zeros(b, L, dtype=torch.int32) if packed else None
args = (rows(), torch.empty(dim, width, dtype=torch.bfloat16), torch.empty(dim, dtype=torch.bfloat16), rows(),
        seq_idx, None, None, rows(), None, width, True)
dims = slide.SLIDE.dims_from_args(args)
bound = slide.SLIDE.kernel.bind(args)
compiled = lowering.compile_for_gpu(bound, helion.Config.from_dict(slide.default_config(dims)), args)
print(json.dumps({"shared": compiled.metadata.shared, **lowering.ptxas_usage(compiled)}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("packed", ["dense", "packed"])
def test_the_default_config_compiles_to_sm90_without_spills_staging_rows(packed: str):
    """Triton's compiler and ptxas for an H200, on the CPU (`autotune_cli.lowering.compile_for_gpu`):
    the rows kept from the steps before fit in registers, and one row per step should reach the
    software pipeline (shared-memory stages), or a row per step leaves the memory system idle.
    Triton 3.6 staged the rows only while it dropped the older kept rows from the loop's carries
    (the H100 figures in experiments/README.md are of that kernel); carried, they are not staged:
    an expected failure until a Triton stages them or the kernel is reshaped (time it first)."""
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k != "HELION_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _COMPILE, packed], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["spill_stores"] == got["spill_loads"] == 0, got
    # x's and dout's rows staged ahead: (stages - 1) x 2 rows x 256 channels x 2 bytes, at least.
    if got["shared"] < 2 * 2 * 256 * 2:
        pytest.xfail(f"rows not staged by the software pipeline: {got}")
