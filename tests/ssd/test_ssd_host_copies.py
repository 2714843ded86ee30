"""`mamba_chunk_scan_combined` at the layout mamba-ssm's `Mamba2` module passes it (x, B, C and dt
as views of one in_proj output, split and reshaped, never made contiguous): what the drop-in copies
outside its kernels. The kernels run for real (Helion ref mode on the CPU); a TorchDispatchMode
records the copy ops (`copy_`, `cat`, `_to_copy`, `clone`) issued outside `runtime.run` from the
project's own code (autograd's concatenation of the split views' gradients is the caller's split,
not ours). The forward copies nothing; the backward only casts dB and dC summed from fp32 head
partials, where the dB/dC kernel splits a group's heads.
"""

from __future__ import annotations

import pytest
import torch
from host_copies import HostCopies

from mamba_tune.ssd import chunk_state_scan_bwd_dbdc, mamba_chunk_scan_combined

pytestmark = pytest.mark.usefixtures("ssd_ref_mode")

@pytest.mark.parametrize("runs", [pytest.param(1, id="one-head-run"), pytest.param(2, id="two-head-runs")])
def test_the_module_layout_reaches_the_kernels_without_a_copy(monkeypatch, runs):
    audit = HostCopies(monkeypatch, ours_only=True)
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
