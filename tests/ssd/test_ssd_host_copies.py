"""`mamba_chunk_scan_combined` at the layout mamba-ssm's `Mamba2` module passes it (x, B, C and dt
as views of one in_proj output, split and reshaped, never made contiguous): what the drop-in copies
outside its kernels. The kernels run for real (Helion ref mode on the CPU); a TorchDispatchMode
records the copy ops (`copy_`, `cat`, `_to_copy`, `clone`) issued outside `runtime.run` from the
project's own code (autograd's concatenation of the split views' gradients is the caller's split,
not ours). The forward copies nothing; the backward only casts dB and dC summed from fp32 head
partials, where the dB/dC kernel splits a group's heads.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mamba_tune
from mamba_tune import runtime
from mamba_tune.ssd import chunk_state_scan_bwd_dbdc, mamba_chunk_scan_combined

pytestmark = pytest.mark.usefixtures("ssd_ref_mode")

COPIES = frozenset(("copy_", "cat", "_to_copy", "clone"))
OURS = str(Path(mamba_tune.__file__).resolve().parent)


class _HostCopies(TorchDispatchMode):
    """(op, shape) of each copy op the project's code dispatches while no kernel runs."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, tuple[int, ...]]] = []
        self.in_kernel = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not self.in_kernel and name in COPIES and isinstance(out, torch.Tensor):
            if any(str(Path(f.filename).resolve()).startswith(OURS) for f in traceback.extract_stack()):
                self.seen.append((name, tuple(out.shape)))
        return out


@pytest.mark.parametrize("runs", [pytest.param(1, id="one-head-run"), pytest.param(2, id="two-head-runs")])
def test_the_module_layout_reaches_the_kernels_without_a_copy(monkeypatch, runs):
    audit = _HostCopies()
    real_run = runtime.run

    def run(*args: Any, **kwargs: Any) -> Any:
        audit.in_kernel += 1
        try:
            return real_run(*args, **kwargs)
        finally:
            audit.in_kernel -= 1

    monkeypatch.setattr(runtime, "run", run)
    monkeypatch.setattr(chunk_state_scan_bwd_dbdc, "head_splits", lambda *_args: runs)
    b, L, H, P, G, N, Q = 2, 48, 4, 16, 2, 16, 16
    dim, conv_dim = H * P, H * P + 2 * G * N
    g = torch.Generator().manual_seed(0)
    zxbcdt = torch.randn(b, L, dim + conv_dim + H, generator=g).to(torch.bfloat16).requires_grad_()
    _z, xBC, dt = torch.split(zxbcdt, [dim, conv_dim, H], dim=-1)  # as Mamba2's unfused path splits it
    x, B, C = torch.split(xBC, [dim, G * N, G * N], dim=-1)
    x, B, C = x.reshape(b, L, H, P), B.reshape(b, L, G, N), C.reshape(b, L, G, N)
    assert not x.is_contiguous() and not B.is_contiguous() and not dt.is_contiguous()
    A_log = torch.randn(H, generator=g).requires_grad_()
    D = torch.randn(H, generator=g).requires_grad_()
    dt_bias = torch.randn(H, generator=g).requires_grad_()
    dy = torch.randn(b, L, H, P, generator=g).to(torch.bfloat16)
    with audit:
        y = mamba_chunk_scan_combined(x, dt, -torch.exp(A_log), B, C, Q, D=D, dt_bias=dt_bias, dt_softplus=True)
        forward, audit.seen = audit.seen, []
        y.backward(dy)
    assert forward == [], f"the forward copies on the host: {forward}"
    assert audit.seen == ([] if runs == 1 else [("_to_copy", (b, L, G, N))] * 2), audit.seen
    assert zxbcdt.grad is not None and zxbcdt.grad.isfinite().all()
