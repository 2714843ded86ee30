"""The (heads, positions) cumsum (cumsum_hc.py) in Helion ref mode on the CPU: bitwise the runtime
kernel's outputs, with and without a bias, softplus and limits, a partial last chunk; `installed()`
routes the runtime's F1 through it; the timing script without a GPU exits 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cumsum_hc import CUMSUM_HC, chunk_cumsum_hc, installed

from mamba_tune import runtime
from mamba_tune.ssd import chunk_cumsum

HERE = Path(__file__).resolve().parent


def _inputs(batch: int, seqlen: int, nheads: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    dt = (torch.randn(batch, seqlen, nheads, generator=gen) * 3).to(dtype)
    A = -torch.rand(nheads, generator=gen) * 4
    bias = torch.randn(nheads, generator=gen)
    return dt, A, bias


@pytest.mark.parametrize("batch, seqlen, nheads, chunk", [(2, 100, 6, 32), (1, 64, 8, 16), (2, 37, 3, 16)],
                         ids=["partial-chunk", "whole-chunks", "odd-heads"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_outputs_are_the_runtime_kernels_bits(batch, seqlen, nheads, chunk, dtype):
    dt, A, bias = _inputs(batch, seqlen, nheads, dtype)
    for kw in ({"dt_bias": bias, "dt_softplus": True}, {"dt_softplus": False, "dt_limit": (0.001, 0.5)},
               {"dt_bias": bias, "dt_softplus": True, "dt_limit": (0.01, 2.0)}):
        want = chunk_cumsum.chunk_cumsum_fwd(dt, A, chunk, **kw)
        got = chunk_cumsum_hc(dt, A, chunk, **kw)
        for w, g in zip(want, got):
            assert g.shape == w.shape and g.dtype == w.dtype == torch.float32
            assert torch.equal(g, w), kw


def test_installed_routes_the_runtimes_cumsum_through_it(monkeypatch):
    dt, A, bias = _inputs(2, 48, 4, torch.bfloat16)
    want = chunk_cumsum.chunk_cumsum_fwd(dt, A, 16, dt_bias=bias, dt_softplus=True)
    ran = []  # which runtime kernels the calls launched (the real runtime.run runs them)
    real_run = runtime.run
    monkeypatch.setattr(runtime, "run", lambda rk, args: ran.append(rk.key.name) or real_run(rk, args))
    with installed():
        got = chunk_cumsum.chunk_cumsum_fwd(dt, A, 16, dt_bias=bias, dt_softplus=True)
    chunk_cumsum.chunk_cumsum_fwd(dt, A, 16, dt_bias=bias, dt_softplus=True)
    assert ran == [CUMSUM_HC.key.name, "ssd_chunk_cumsum"]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    # Out of the block the runtime's own kernel runs again; bad input is still its one-line error.
    with pytest.raises(ValueError, match=r"^ssd: dt must be \(batch, seqlen, nheads\)"):
        chunk_cumsum_hc(dt[0], A, 16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_the_timing_script_without_a_gpu_exits_2():
    r = subprocess.run([sys.executable, str(HERE / "time_cumsum_hc.py"), "nemotron-3-nano-30b"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "GPU" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, str(HERE / "time_cumsum_hc.py"), "nano"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "unknown preset 'nano'" in r.stderr, r.stderr
