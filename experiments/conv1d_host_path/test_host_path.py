"""The timed callables (host_path.py) in Helion ref mode on the CPU: the kernel's host function and
the layer's call compute the same forward output and dx; the timing script's exit without a GPU:
ssd_bwd_paths/test_ssd_bwd_paths.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from host_path import calls, layer_inputs

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="Helion ref mode on CPU tensors")
def test_the_kernel_and_the_layers_call_compute_the_same():
    t = layer_inputs(2, 24, 40, 56, "cpu")
    c = calls(t)
    assert set(c) >= {"fwd kernel", "fwd call", "bwd kernel", "bwd call"}
    assert torch.equal(c["fwd kernel"](), c["fwd call"]())
    dx_kernel, dw_kernel, db_kernel = c["bwd kernel"]()
    dx_call, dw_call, db_call, _ = c["bwd call"]()
    assert torch.equal(dx_kernel, dx_call)
    assert torch.equal(dw_kernel.t().to(torch.bfloat16), dw_call) and torch.equal(db_kernel.to(torch.bfloat16), db_call)
    assert t["x"].stride() == (24 * 56, 1, 56)  # the layer's slice: rows 56 apart

