"""What the fused layer copies outside its kernels (the host's torch ops), forward and backward.

Every activation-sized copy on the host is GPU memory traffic that no kernel accounts for. The
kernels run for real (Helion ref mode on the CPU); a TorchDispatchMode records the copy ops
(`copy_`, `cat`, `_to_copy`, `clone`) issued outside `runtime.run`, so what a kernel does inside
is not counted. The forward copies nothing. The backward's activation-sized copies are its
glue: dz and ddt written into their slices of the layer's gradient
buffer, dx, dB and dC concatenated into the conv's gradient, and dB and dC summed from fp32 head
partials where the dB/dC kernel splits a group's heads. Removing one needs a kernel that writes
into the slice; this test then changes with it.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from host_copies import SYNCS, HostCopies
from layer_inputs import Layer

import mamba_tune
from mamba_tune.ssd import chunk_state_scan_bwd_dbdc

pytestmark = pytest.mark.usefixtures("layer_ref_mode")


def test_the_layers_host_copies_are_the_known_glue(monkeypatch):
    audit = HostCopies(monkeypatch)
    layer = Layer.make(torch.bfloat16)
    b, L = layer.tensors["zxbcdt"].shape[:2]
    nheads, ngroups = layer.tensors["A"].shape[0], layer.kwargs["ngroups"]
    dim = layer.tensors["rmsnorm_weight"].shape[0]
    conv_dim, dstate = layer.tensors["conv1d_weight"].shape[0], (layer.tensors["conv1d_weight"].shape[0] - dim) // (2 * ngroups)
    leaves = layer.leaves()
    args, kw = layer.call_args(leaves)
    dout = torch.randn(b, L, layer.tensors["outproj_weight"].shape[0], generator=torch.Generator().manual_seed(1))
    dout = dout.to(torch.bfloat16)
    with audit:
        out, _final = mamba_tune.mamba_split_conv1d_scan_combined(*args, return_final_states=True, **kw)
        forward, audit.seen = audit.seen, []
        out.backward(dout)
    assert forward == [], f"the forward copies on the host: {forward}"
    # Activation-sized: (batch, seqlen, ...).
    big = Counter(s for s in audit.seen if s[1][:2] == (b, L))
    splits = chunk_state_scan_bwd_dbdc.head_splits(b, -(-L // layer.chunk_size), ngroups, nheads)
    want = Counter({("copy_", (b, L, dim)): 1,  # dz into its slice of the gradient buffer
                    ("copy_", (b, L, nheads)): 1,  # ddt into its slice
                    ("cat", (b, L, conv_dim)): 1})  # dx, dB, dC into the conv's gradient
    if splits > 1:  # dB and dC summed over the head runs' fp32 partials, then cast
        want[("_to_copy", (b, L, ngroups, dstate))] = 2
    assert big == want
    # The rest are parameter-sized: the gradients of A and D, the conv weight and bias cast to
    # their dtypes, and autograd's copy of the conv weight's gradient into its leaf.
    small = [s for s in audit.seen if s[1][:2] != (b, L)]
    width = layer.tensors["conv1d_weight"].shape[1]
    assert all(torch.Size(shape).numel() <= conv_dim * width for _, shape in small), small


@pytest.mark.parametrize("options", [
    pytest.param({}, id="default"),
    pytest.param({"seq_idx": True, "initial_states": True, "D_per_head": False, "dt_limit": (0.01, 0.2)},
                 id="seq_idx-init-D-hdim-dt_limit"),
    pytest.param({"rmsnorm": False, "d_mlp": 4}, id="no-norm-d_mlp"),
])
def test_the_layers_step_reads_no_tensor_value_on_the_host(monkeypatch, options):
    """No item(), bool(tensor) or value-shaped op outside the kernels, forward or backward: on
    the GPU each would be a sync, and the training step could not be captured in a CUDA graph."""
    audit = HostCopies(monkeypatch, ops=SYNCS)
    layer = Layer.make(torch.bfloat16, **options)
    leaves = layer.leaves()
    args, kw = layer.call_args(leaves)
    with audit:
        out, final = mamba_tune.mamba_split_conv1d_scan_combined(*args, return_final_states=True, **kw)
        torch.autograd.backward([out, final], [torch.ones_like(out), torch.ones_like(final)])
    assert audit.seen == []
    assert all(v.grad is not None for v in leaves.values())
