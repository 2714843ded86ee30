"""What the fused layer copies outside its kernels (the host's torch ops), forward and backward.

Every activation-sized copy on the host is GPU memory traffic that no kernel accounts for. The
kernels run for real (Helion ref mode on the CPU); a TorchDispatchMode records the copy ops
(`copy_`, `cat`, `_to_copy`, `clone`) issued outside `runtime.run`, so what a kernel does inside
is not counted. The forward copies nothing, and neither does the backward: its kernels write dz,
ddt and the conv's dxBC into their slices of the layer's gradient buffer and the SSD's dx, dB and
dC into the conv's output gradient, as mamba-ssm's fused backward does. The one exception is
where the dB/dC kernel splits a group's heads into runs and torch sums their fp32 partials: the
sum is cast into dB's and dC's slices (two copies). (Without
the norm, z gates the SSD: its split state-passing backward, `combined.split_state_passing_bwd`,
gates dout with torch ops; the case without the norm runs the one walk.)
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


# One head per group: the dB/dC kernel runs each group's heads in one run (head_splits 1).
ONE_RUN = {"ngroups": 4}


@pytest.mark.parametrize("options", [
    pytest.param(ONE_RUN, id="one-run"),
    pytest.param({}, id="head-runs"),
    pytest.param({**ONE_RUN, "rmsnorm": False, "seq_idx": True, "initial_states": True},
                 id="no-norm-seq_idx"),
])
def test_the_layers_host_copies(monkeypatch, options):
    monkeypatch.setenv("MAMBA_TUNE_SSD_SP_BWD", "fused")
    audit = HostCopies(monkeypatch)
    layer = Layer.make(torch.bfloat16, **options)
    b, L = layer.tensors["zxbcdt"].shape[:2]
    nheads, ngroups = layer.tensors["A"].shape[0], layer.kwargs["ngroups"]
    conv_dim = layer.tensors["conv1d_weight"].shape[0]
    dim = layer.kwargs["headdim"] * nheads
    dstate = (conv_dim - dim) // (2 * ngroups)
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
    assert (splits == 1) == (options.get("ngroups") == nheads)
    want = Counter()
    if splits > 1:  # dB and dC summed over the head runs' fp32 partials, cast into place
        want[("copy_", (b, L, ngroups, dstate))] = 2
    assert big == want
    # The rest are parameter-sized: the gradients of A and D, the conv weight and bias (and the
    # initial states) cast to their dtypes, and autograd's copy of the conv weight's gradient
    # into its leaf.
    small = [s for s in audit.seen if s[1][:2] != (b, L)]
    width = layer.tensors["conv1d_weight"].shape[1]
    most = max(conv_dim * width, b * dim * dstate)
    assert all(torch.Size(shape).numel() <= most for _, shape in small), small


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
