"""The head runs' fold (runs_sum.py) in Helion ref mode on the CPU (the GPU test: `pytest -m gpu`):
bitwise the runs added in order and rounded once, at odd sizes and every float dtype; within one
rounding of the runtime's torch sum; the whole SSD backward on it equal to the torch path's; the
timing script without a GPU exits 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runs_sum import installed, sum_runs

from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as dbdc

HERE = Path(__file__).resolve().parent

# (runs, batch, seqlen, ngroups, dstate)
PARTS = [
    pytest.param((2, 1, 100, 2, 16), id="R2-G2-N16"),
    pytest.param((3, 2, 37, 3, 24), id="R3-G3-N24-odd"),  # dstate not a power of two
    pytest.param((8, 2, 80, 1, 64), id="R8-G1-N64"),  # Zamba2's form: one group, 8 runs
]


def _in_order(part: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    acc = part[0].clone()
    for r in range(1, part.size(0)):
        acc = acc + part[r]
    return acc.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("shape", PARTS)
def test_the_fold_adds_the_runs_in_order(shape, dtype):
    gen = torch.Generator().manual_seed(0)
    dB_part, dC_part = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen) * 100
    dB, dC = sum_runs(dB_part, dC_part, dtype)
    assert dB.shape == dC.shape == shape[1:] and dB.dtype == dC.dtype == dtype
    assert torch.equal(dB, _in_order(dB_part, dtype))
    assert torch.equal(dC, _in_order(dC_part, dtype))
    # The runtime's torch sum may add in another order: within one rounding of the output's dtype.
    ulp = torch.finfo(dtype).eps
    for ours, part in ((dB, dB_part), (dC, dC_part)):
        theirs = dbdc.sum_splits(part, dtype).float()
        assert ((ours.float() - theirs).abs() <= ulp * theirs.abs() + 1e-6).all()


def test_one_run_takes_no_fold():
    part = torch.randn(1, 2, 16, 1, 16).to(torch.bfloat16)
    dB, _dC = sum_runs(part, part, torch.bfloat16)
    assert dB.data_ptr() == part.data_ptr()  # the dB/dC kernel wrote dB in x's dtype itself


def _grads(shape: tuple[int, ...], seed: int) -> dict[str, torch.Tensor]:
    from autotune_cli.tuning.ssd.inputs import SSDInputs
    from mamba_tune.keys import bwd_partials
    from mamba_tune.ssd import mamba_chunk_scan_combined

    b, L, H, P, G, N, Q = shape
    flags = {"has_dt_bias": 1, "dt_softplus": 1, "has_D": 1, "has_seq_idx": 1, "has_initial_states": 1}
    i = SSDInputs.make({"batch": b, "seqlen": L, "nheads": H, "headdim": P, "ngroups": G, "dstate": N,
                        "chunk_size": Q, **bwd_partials(P, N), **flags}, torch.bfloat16, "cpu", seed)
    names = ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_states")
    leaves = {k: getattr(i, k).detach().clone().requires_grad_() for k in names}
    kw = {**i.kwargs(), **{k: v for k, v in leaves.items() if k not in ("x", "dt", "A", "B", "C")}}
    out = mamba_chunk_scan_combined(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], i.chunk_size,
                                    **kw)
    dy = torch.randn(*out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(out.dtype)
    return dict(zip(leaves, torch.autograd.grad(out, list(leaves.values()), dy), strict=True))


def test_the_backward_on_the_fold_matches_the_torch_path():
    """One group of 6 heads (Mamba2's form), seq_idx and initial states: every gradient of the torch
    path (dB and dC within one bf16 rounding, the rest bitwise: the fold is their last step)."""
    shape = (2, 80, 6, 24, 1, 32, 32)
    assert dbdc.head_splits(2, 3, 1, 6) > 1
    want = _grads(shape, 4)
    with installed():
        got, again = _grads(shape, 4), _grads(shape, 4)
    assert dbdc.sum_runs is not sum_runs  # uninstalled
    for name in want:
        assert torch.equal(got[name], again[name]), f"d{name} differs between two runs"
        if name in ("B", "C"):
            scale = want[name].float().abs()
            assert ((got[name].float() - want[name].float()).abs() <= 2 ** -8 * scale + 1e-6).all(), name
        else:
            assert torch.equal(got[name], want[name]), f"d{name} changed with the sum path"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_fold_on_the_gpu():
    part = torch.randn(8, 2, 8192, 1, 64, device="cuda")
    part2 = torch.randn_like(part)
    dB, dC = sum_runs(part, part2, torch.bfloat16)
    assert torch.equal(dB, _in_order(part, torch.bfloat16)) and torch.equal(dC, _in_order(part2, torch.bfloat16))


def test_the_timing_script_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = subprocess.run([sys.executable, str(HERE / "time_runs_sum.py"), "zamba2-2.7b"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().endswith("needs a CUDA GPU"), r.stderr
