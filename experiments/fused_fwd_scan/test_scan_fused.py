"""The fused F2 + F3 + F5 candidate (scan_fused.py) in Helion ref mode on the CPU: the runtime
forward's output, final states and entering states, with and without D, z, initial states, a
partial last chunk, groups; the timing script without a GPU exits 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scan_fused import state_scan

from mamba_tune.ssd import bmm, chunk_cumsum, chunk_scan, chunk_state_passing

HERE = Path(__file__).resolve().parent


def _inputs(batch, seqlen, nheads, headdim, ngroups, dstate, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seqlen, nheads, headdim, generator=gen).to(dtype)
    dt = (torch.rand(batch, seqlen, nheads, generator=gen) * 0.5).to(dtype)
    A = -torch.rand(nheads, generator=gen) * 2
    B = torch.randn(batch, seqlen, ngroups, dstate, generator=gen).to(dtype)
    C = torch.randn(batch, seqlen, ngroups, dstate, generator=gen).to(dtype)
    D = torch.randn(nheads, generator=gen)
    z = torch.randn(batch, seqlen, nheads, headdim, generator=gen).to(dtype)
    init = torch.randn(batch, nheads, headdim, dstate, generator=gen)
    return x, dt, A, B, C, D, z, init


@pytest.mark.parametrize("shape", [(2, 64, 4, 16, 2, 16, 32), (1, 80, 2, 32, 1, 32, 32), (1, 48, 4, 16, 4, 16, 16)],
                         ids=["groups", "partial-chunk", "group-per-head"])
@pytest.mark.parametrize("opts", ["plain", "D-z-init"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_runtime_forwards_outputs(shape, opts, dtype):
    batch, seqlen, nheads, headdim, ngroups, dstate, chunk = shape
    x, dt, A, B, C, D, z, init = _inputs(batch, seqlen, nheads, headdim, ngroups, dstate, dtype)
    if opts == "plain":
        D = z = init = None
    dA, dt_out = chunk_cumsum._launch(dt, A, chunk, None, True, (0.0, float("inf")))
    states, final = chunk_state_passing._launch(B, x, dt_out, dA, init, None, x.dtype)
    cb = bmm._launch(C, B, chunk, None)
    y = chunk_scan._launch(x, cb, None, C, dt_out, dA, states, D, z, None)
    got_y, got_final, got_states = state_scan(x, cb, B, C, dt_out, dA, D, z, init, keep_states=True)
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 2e-2}
    torch.testing.assert_close(got_states, states, **tol)
    torch.testing.assert_close(got_final, final, **tol)
    torch.testing.assert_close(got_y, y, **tol)
    assert got_y.dtype == y.dtype and got_final.dtype == torch.float32


def test_without_kept_states_nothing_is_written():
    x, dt, A, B, C, *_ = _inputs(1, 32, 2, 16, 1, 16, torch.float32)
    dA, dt_out = chunk_cumsum._launch(dt, A, 16, None, True, (0.0, float("inf")))
    _, _, states = state_scan(x, bmm._launch(C, B, 16, None), B, C, dt_out, dA)
    assert states is None


@pytest.mark.parametrize("script", ["time_scan_fused.py", "time_module_fused.py"])
def test_the_timing_scripts_need_a_gpu(script):
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    r = subprocess.run([sys.executable, str(HERE / script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr, r.stderr


_COMPILE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import helion, torch
from scan_fused import args_for, state_scan_kernel
from autotune_cli.lowering import compile_for_gpu, dropped_loop_carries, ptxas_usage
b, L, h, p, g, n, ch = 2, 8192, 64, 64, 8, 128, 128
e = lambda *s, dt=torch.bfloat16: torch.empty(*s, dtype=dt)
f32 = torch.float32
args = args_for(e(b, L, h, p), e(b, L // ch, g, ch, ch, dt=f32), e(b, L, g, n), e(b, L, g, n), e(b, h, L // ch, ch, dt=f32),
                e(b, h, L // ch, ch, dt=f32), torch.empty(h), None, None, False)
bound = state_scan_kernel.bind(args)
cfg = helion.Config(block_sizes=[32, 64, 32, 64], num_warps=4, num_stages=2)
print(json.dumps({**ptxas_usage(compile_for_gpu(bound, cfg, args)), "dropped": dropped_loop_carries(bound, cfg, args)}))
"""


def test_it_compiles_to_sm90_carrying_the_state_without_spills():
    """Triton's compiler and ptxas for sm90 on the CPU at Nemotron-3 Nano TP1: the state carried
    from chunk to chunk is carried by the generated loop (Triton's front end drops a variable it
    thinks unchanged) and the registers hold it without spills."""
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k != "HELION_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _COMPILE, str(HERE)], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["dropped"] == [] and got["spill_stores"] == got["spill_loads"] == 0, got


@pytest.mark.parametrize("with_z", [False, True], ids=["no-z", "z"])
def test_installed_the_autograd_forward_and_backward_agree(with_z):
    from scan_fused import installed

    import mamba_tune
    from mamba_tune.ssd import combined

    x, dt, A, B, C, D, z, _ = _inputs(1, 64, 4, 16, 2, 16, torch.float32)
    bias = torch.zeros(4)

    def run():
        leaves = [t.clone().requires_grad_() for t in (x, dt, A, B, C, D)]
        y = mamba_tune.mamba_chunk_scan_combined(*leaves[:5], 32, D=leaves[5], z=z if with_z else None,
                                                 dt_bias=bias, dt_softplus=True)
        grads = torch.autograd.grad(y, leaves, torch.ones_like(y))
        return y.detach(), grads

    want_y, want_g = run()
    saved = combined._forward
    with installed():
        assert combined._forward is not saved
        got_y, got_g = run()
    assert combined._forward is saved
    torch.testing.assert_close(got_y, want_y, atol=1e-4, rtol=1e-4)
    for g, w in zip(got_g, want_g):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)

