"""A tuned config fits the calls training makes: each kernel's config space (Helion's structural
fingerprint of its ConfigSpec) at the tuning record's problem equals the one at the real call.

The tuner searches configs for `make_problem(dims)`'s arguments; the run time applies them to the
arguments mamba-ssm's modules hand the kernels. Where the two bind to different config spaces
(a loop that is a static range in one and not the other, a different number of loads), Helion
rejects every tuned config at run time and the kernel falls back to its default. That happened
on the H200 (2026-12-02): `ssd_chunk_cumsum_bwd` was tuned on one partial sum of each kind while
training hands it 4 and 32 ("Too many values for config['static_ranges'], expected 1, got 2").

Here the real calls run on the CPU (ref mode) at Mamba-2 proportions (headdim 64, dstate 128, so
the partial counts are a real layer's), every kernel call's argument layout is captured, and a
subprocess in compiled mode binds each kernel twice - to the captured layout and to
`shape_args(record, dims_from_args(captured))` - and compares the fingerprints. CPU only: binding
runs Helion's front end, no GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from layer_inputs import Layer

import mamba_tune
from mamba_tune import runtime

# Ref mode with Helion's own block sizes (one tile per loop): only the calls' layouts matter here.
pytestmark = pytest.mark.parametrize("layer_ref_mode", ["max"], indirect=True)


def _layout(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return {"size": list(a.shape), "stride": list(a.stride()), "offset": a.storage_offset(),
                "dtype": str(a.dtype).removeprefix("torch.")}
    if a is None or isinstance(a, bool | int | float | str):
        return {"value": a}
    raise TypeError(f"unexpected kernel argument {type(a).__name__}")


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, dict[str, Any]]]:
    """Every kernel call through the run time, by (kernel, layout): {"kernel", "args"}."""
    calls: dict[str, dict[str, Any]] = {}
    lookup: Callable[..., Any] = runtime.lookup

    def capture(rk: runtime.RuntimeKernel, args: Any) -> Any:
        entry = {"kernel": rk.name, "args": [_layout(a) for a in args]}
        calls.setdefault(json.dumps(entry, sort_keys=True), entry)
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


_WORKER = r"""
import json, sys, torch
from autotune_cli.lowering import shape_args
from autotune_cli.tuning import all_kernels
from mamba_tune import runtime
torch.set_num_threads(1)
records = {tk.runtime.name: tk for tk in all_kernels().values()}


def real(layout):
    if "value" in layout:
        return layout["value"]
    dtype = getattr(torch, layout["dtype"])
    need = layout["offset"] + 1 + sum((n - 1) * s for n, s in zip(layout["size"], layout["stride"]) if n > 0)
    return torch.empty(need, dtype=dtype).as_strided(layout["size"], layout["stride"], layout["offset"])


for call in json.loads(sys.stdin.read()):
    name = call["kernel"]
    result = {"kernel": name}
    tk = records.get(name)
    if tk is None:
        result["error"] = "no tuning record"
    else:
        try:
            args = tuple(real(a) for a in call["args"])
            dims = tk.runtime.dims_from_args(args)
            dtype = runtime.dtype_of(args, tk.runtime)
            result["dims"] = dims
            result["real"] = tk.runtime.kernel.bind(args).config_spec.structural_fingerprint_hash()
            result["tuned"] = tk.runtime.kernel.bind(shape_args(tk, dims, dtype)).config_spec.structural_fingerprint_hash()
        except Exception as e:
            result["error"] = f"{type(e).__name__}: {e}"[:1500]
    print(json.dumps(result), flush=True)
"""


def test_tuning_problems_bind_to_the_config_space_of_the_calls_training_makes(layer_ref_mode, captured, clean_env):
    _layer_step()  # mamba-ssm's fused Mamba2 path: conv1d, SSD and gated norm forward and backward
    _layer_step(rmsnorm=False, seq_idx=True, D_per_head=False)  # z through the SSD, packed sequences
    _ssd_step()
    calls = list(captured.values())
    assert {c["kernel"] for c in calls} >= {"ssd_chunk_cumsum_bwd", "ssd_chunk_scan_chunk_state_bwd_dx",
                                             "causal_conv1d_bwd", "gated_norm_bwd", "ssd_chunk_scan"}
    proc = subprocess.run([sys.executable, "-c", _WORKER], input=json.dumps(calls), capture_output=True, text=True,
                          env=clean_env, timeout=900)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and len(results) == len(calls), proc.stderr[-3000:]
    errors = [r for r in results if "error" in r]
    assert not errors, errors
    differ = [f"{r['kernel']} at {r['dims']}" for r in results if r["real"] != r["tuned"]]
    assert not differ, f"the tuning problem binds to another config space than the real call: {differ}"
