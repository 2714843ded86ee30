"""A tuned config fits the calls training makes: each kernel's config space (Helion's structural
fingerprint of its ConfigSpec) at the tuning record's problem equals the one at the real call.

The tuner searches configs for `make_problem(dims)`'s arguments; the run time applies them to the
arguments mamba-ssm's modules hand the kernels. Where the two bind to different config spaces
(a loop that is a static range in one and not the other, a different number of loads), Helion
rejects every tuned config at run time and the kernel falls back to its default. That happened
on the H200: `ssd_chunk_cumsum_bwd` was tuned on one partial sum of each kind while
training hands it 4 and 32 ("Too many values for config['static_ranges'], expected 1, got 2").

Here the real calls run on the CPU (ref mode) at Mamba-2 proportions (headdim 64, dstate 128, so
the partial counts are a real layer's), every kernel call's argument layout is captured as meta
tensors, and each kernel is bound in compiled mode twice - to the captured layout and, through
`autotune_cli.lowering.config_spec` (what `validate` checks bundles with), to its tuning record's
problem at `dims_from_args(captured)` - and the fingerprints compared. CPU only: binding runs
Helion's front end, no GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from layer_inputs import Layer

import mamba_tune
from autotune_cli.lowering import compiled_mode, config_spec
from autotune_cli.tuning import all_kernels
from mamba_tune import runtime

# Ref mode with Helion's own block sizes (one tile per loop): only the calls' layouts matter here.
# Slow: two compiled-mode binds per kernel the layer calls (CI: ~55 s); handed out first under xdist.
pytestmark = [pytest.mark.slow, pytest.mark.parametrize("layer_ref_mode", ["max"], indirect=True)]


def _meta(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(tuple(a.shape), tuple(a.stride()), dtype=a.dtype, device="meta")
    return a


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[tuple[Any, ...], tuple[runtime.RuntimeKernel, tuple]]]:
    """Every kernel call through the run time, one per (kernel, layout): (kernel, meta args)."""
    calls: dict[tuple[Any, ...], tuple[runtime.RuntimeKernel, tuple]] = {}
    lookup: Callable[..., Any] = runtime.lookup

    def capture(rk: runtime.RuntimeKernel, args: Any) -> Any:
        meta = tuple(_meta(a) for a in args)
        layout = tuple((a.shape, a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in meta)
        calls.setdefault((rk.name, layout), (rk, meta))
        return lookup(rk, args)

    monkeypatch.setattr(runtime, "lookup", capture)
    yield calls


# Mamba-2 proportions at a CPU-sized length: 2 heads of 64, one group, dstate 128, 3 chunks of 64
# (the last one partial).
DIMS = {"batch": 1, "seqlen": 150, "nheads": 2, "headdim": 64, "ngroups": 1, "dstate": 128, "chunk_size": 64}


def _layer_step(**options: Any) -> None:
    layer = Layer.make(torch.bfloat16, **DIMS, **options)
    leaves = layer.leaves()
    args, kw = layer.call_args(leaves)
    out = mamba_tune.mamba_split_conv1d_scan_combined(*args, **kw)
    out.float().square().sum().backward()


def _ssd_step() -> None:
    # The SSD alone as mamba-ssm's Mamba2 (unfused path) calls it, plus z, initial states and a
    # final-state gradient (the options the layer above leaves out).
    from autotune_cli.tuning.ssd.inputs import SSDInputs

    flags = {"has_D": 1, "has_dt_bias": 1, "dt_softplus": 1, "has_z": 1, "has_initial_states": 1}
    i = SSDInputs.make({**DIMS, **flags}, torch.bfloat16, "cpu", seed=0)
    x, init = i.x.clone().requires_grad_(), i.initial_states.clone().requires_grad_()
    out, final = mamba_tune.mamba_chunk_scan_combined(x, i.dt, i.A, i.B, i.C, i.chunk_size, D=i.D, z=i.z,
                                                      dt_bias=i.dt_bias, initial_states=init, dt_softplus=True,
                                                      return_final_states=True)
    (out.float().square().sum() + final.square().sum()).backward()


def test_tuning_problems_bind_to_the_config_space_of_the_calls_training_makes(layer_ref_mode, captured):
    _layer_step()  # mamba-ssm's fused Mamba2 path: conv1d, SSD and gated norm forward and backward
    _layer_step(rmsnorm=False, seq_idx=True, D_per_head=False)  # z through the SSD, packed sequences
    _ssd_step()
    records = {tk.runtime.name: tk for tk in all_kernels().values()}
    assert {name for name, _ in captured} >= {"ssd_chunk_cumsum_bwd", "ssd_chunk_scan_chunk_state_bwd_dx",
                                              "causal_conv1d_bwd_slide", "gated_norm_bwd", "ssd_chunk_scan"}
    assert {name for name, _ in captured} <= set(records), "a kernel without a tuning record"
    differ = []
    for rk, meta in captured.values():
        dims = rk.dims_from_args(meta)
        # In one compiled-mode block: where the tuning problem's layout is the call's (Helion's
        # specialization key), the second bind is Helion's bound kernel of the first, as at run time.
        with compiled_mode(rk.kernel):
            real = rk.kernel.bind(meta).config_spec.structural_fingerprint_hash()
            tuned = config_spec(records[rk.name], dims, runtime.dtype_of(meta, rk)).structural_fingerprint_hash()
        if real != tuned:
            differ.append(f"{rk.name} at {dims}")
    assert not differ, f"the tuning problem binds to another config space than the real call: {differ}"
