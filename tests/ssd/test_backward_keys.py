"""The backward's run-time keys are the ones the specs tune.

Measured on the H200: a bf16 forward+backward at Nemotron-3 Nano dims looked up
`ssd_chunk_scan_chunk_state_bwd_dx|...|fp32` and `ssd_chunk_cumsum_bwd|...|fp32` (their first
tensors are fp32 buffers) and `ssd_chunk_state_passing_bwd|...,has_dfinal=1,...` (autograd
handed the unused final_states a tensor of zeros), while `plan` lists bf16 keys with
has_dfinal=0: no tuned entry could ever have served those calls.
"""

from __future__ import annotations

import json

import pytest
import torch

import mamba_tune
from autotune_cli.plan import plan, runs_for
from autotune_cli.spec import load_spec
from autotune_cli.tuning.ssd.inputs import SSDInputs
from mamba_tune.bundle import entry_key

BWD = ("ssd_chunk_state_passing_bwd", "ssd_chunk_scan_chunk_state_bwd_dx", "ssd_chunk_state_scan_bwd_dbdc",
       "ssd_chunk_cumsum_bwd")


@pytest.mark.parametrize("sp_path", ["fused", "split"])
@pytest.mark.parametrize("return_final_states", [False, True], ids=["out-only", "with-final-states"])
def test_backward_keys_name_the_model_dtype_and_dfinal_only_when_used(ssd_ref_mode, tmp_path, monkeypatch,
                                                                      return_final_states, sp_path):
    monkeypatch.setenv("MAMBA_TUNE_SSD_SP_BWD", sp_path)
    dims = {"batch": 1, "seqlen": 40, "nheads": 2, "headdim": 16, "ngroups": 1, "dstate": 16, "chunk_size": 16,
            "has_D": 1, "has_dt_bias": 1, "dt_softplus": 1}
    i = SSDInputs.make(dims, torch.bfloat16, "cpu", seed=0)
    x = i.x.clone().requires_grad_()
    record = tmp_path / "calls.json"
    with mamba_tune.record_calls(record):
        res = mamba_tune.mamba_chunk_scan_combined(x, i.dt, i.A, i.B, i.C, i.chunk_size, D=i.D, dt_bias=i.dt_bias,
                                                dt_softplus=True, return_final_states=return_final_states)
        out = res[0] if return_final_states else res
        loss = out.float().square().sum() + (res[1].sum() if return_final_states else 0.0)
        loss.backward()
    calls = json.loads(record.read_text())["calls"]
    # B2 + B3: one walk, or F2's kernel then the elementwise walk.
    sp = "ssd_state_passing_bwd" if sp_path == "split" else "ssd_chunk_state_passing_bwd"
    want = (sp, *BWD[1:])
    bwd = {c["kernel"]: c for c in calls.values() if c["kernel"] in (*BWD, "ssd_state_passing_bwd")}
    assert sorted(bwd) == sorted(want)
    for name, c in bwd.items():
        assert c["dtype"] == "bf16", (name, c["dtype"])
    assert bwd[sp]["dims"]["has_dfinal"] == int(return_final_states)


def test_the_mixer_calls_backward_keys_that_the_nano_spec_tunes():
    # The dims a spec plans for the mixer call (no final-state gradient) are the dims the
    # run-time sees for it (checked above on a small shape); here: the keys exist in the plan.
    combos = plan(load_spec("sweeps/nemotron-nano.yaml"))
    planned = {c.kernel: c for c in combos if c.kernel in BWD}
    assert sorted(planned) == sorted(BWD)
    assert all(c.dtype == "bf16" for c in planned.values())
    assert planned["ssd_chunk_state_passing_bwd"].dims["has_dfinal"] == 0


def test_bench_backward_kernel_rows_run_each_kernel_through_the_runtime(tmp_path):
    # `bench --family ssd --ssd-stage bwd_dx` (and the other three) crashed on the H200: it handed
    # the runtime the tuning record instead of the kernel. On the CPU (ref mode) each row's call runs,
    # and the runtime resolves (and here records) the kernel's own key.
    from autotune_cli.benchmarks.ssd import BWD_KERNELS, bwd_kernel_calls
    from mamba_tune.keys import ModelShape

    shape = ModelShape(batch=1, seqlen=96, nheads=4, headdim=8, ngroups=2, dstate=8, chunk_size=32)
    calls = bwd_kernel_calls(shape, torch.float32, torch.device("cpu"), list(BWD_KERNELS) + ["total"])
    assert sorted(calls) == sorted(BWD_KERNELS)
    with mamba_tune.record_calls(tmp_path / "calls.json"):
        for stage, (ours, base) in calls.items():
            out = ours()
            outs = out if isinstance(out, tuple) else (out,)
            assert base is None and all(torch.isfinite(t).all() for t in outs if isinstance(t, torch.Tensor)), stage
    recorded = json.loads((tmp_path / "calls.json").read_text())
    # B2 + B3's row runs the path the backward takes: split at these 4 heads (F2's kernel, then the walk).
    want = set(BWD_KERNELS.values()) - {"ssd_chunk_state_passing_bwd"} | {"ssd_chunk_state", "ssd_state_passing_bwd"}
    assert {c["kernel"] for c in recorded["calls"].values()} == want, recorded


def test_cumsum_bwd_key_counts_the_partials_a_real_backward_hands_it(ssd_ref_mode, tmp_path):
    # The cumsum backward folds one partial per block of headdim (from the dx kernel) and one per
    # 16 x 16 of the state (from the state passing backward); the loops' trip counts shape its
    # config, so a tuned config only fits the counts it was tuned at. The H200's Nano TP1 entry was
    # tuned on one partial of each while training hands it 4 and 32: Helion rejected it on every call
    # (config['static_ranges'] has 2 values, expected 1). A real backward's recorded key must be the
    # key the plan tunes: mamba_tune.keys derives the counts from headdim and dstate.
    from mamba_tune.keys import ModelShape, all_keys, bwd_partials

    shape = ModelShape(batch=1, seqlen=40, nheads=2, headdim=40, ngroups=1, dstate=24, chunk_size=16)
    dims = {"batch": 1, "seqlen": 40, "nheads": 2, "headdim": 40, "ngroups": 1, "dstate": 24, "chunk_size": 16,
            "has_D": 1, "has_dt_bias": 1, "dt_softplus": 1}
    i = SSDInputs.make(dims, torch.float32, "cpu", seed=0)
    x = i.x.clone().requires_grad_()
    with mamba_tune.record_calls(tmp_path / "calls.json"):
        out = mamba_tune.mamba_chunk_scan_combined(x, i.dt, i.A, i.B, i.C, i.chunk_size, D=i.D, dt_bias=i.dt_bias,
                                                dt_softplus=True)
        out.square().sum().backward()
    calls = json.loads((tmp_path / "calls.json").read_text())["calls"].values()
    (recorded,) = [c["dims"] for c in calls if c["kernel"] == "ssd_chunk_cumsum_bwd"]
    assert bwd_partials(40, 24) == {"row_partials": 3, "last_partials": 6}
    # Every model's headdim 64 and dstate 64-128 make one slot; 47B's dstate 256 makes two.
    assert bwd_partials(64, 128) == {"row_partials": 1, "last_partials": 32}
    assert bwd_partials(64, 256) == {"row_partials": 2, "last_partials": 64}
    assert recorded == all_keys()["ssd_chunk_cumsum_bwd"].dims_for(shape), recorded
    # Two heads: B2 + B3 split, its walk keyed on whole chunks (seqlen 40 -> 48), as the plan keys it.
    (walk,) = [c["dims"] for c in calls if c["kernel"] == "ssd_state_passing_bwd"]
    assert walk == all_keys()["ssd_state_passing_bwd"].dims_for(shape) and walk["seqlen"] == 48, walk


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_a_spec_naming_the_split_walk_plans_the_f2_call_it_makes(ssd_ref_mode, tmp_path, packed):
    # The split walk runs F2's kernel (dout as x, C as B, no seq_idx) before its elementwise walk.
    # On the H200 that F2 call ran F2's default config at Zamba2 (0.084 ms of its 0.154 ms walk),
    # since no spec naming the walk planned it: now `plan` lists it with the walk (runs_too).
    from autotune_cli.spec import parse_spec

    dims = {"batch": 1, "seqlen": 40, "nheads": 2, "headdim": 16, "ngroups": 1, "dstate": 16, "chunk_size": 16,
            "has_D": 1, "has_dt_bias": 1, "dt_softplus": 1}
    i = SSDInputs.make(dims, torch.bfloat16, "cpu", seed=0)
    seq_idx = (torch.arange(40) // 24).to(torch.int32)[None] if packed else None
    x = i.x.clone().requires_grad_()
    with mamba_tune.record_calls(tmp_path / "calls.json"):
        out = mamba_tune.mamba_chunk_scan_combined(x, i.dt, i.A, i.B, i.C, i.chunk_size, D=i.D, dt_bias=i.dt_bias,
                                                dt_softplus=True, seq_idx=seq_idx)
        out.float().square().sum().backward()
    calls = json.loads((tmp_path / "calls.json").read_text())["calls"].values()
    assert any(c["kernel"] == "ssd_state_passing_bwd" for c in calls)  # two heads: the split walk
    f2 = {entry_key(c["kernel"], c["dims"], c["dtype"]) for c in calls
          if c["kernel"] == "ssd_chunk_state" and c["dims"]["has_seq_idx"] == 0}
    assert len(f2) == 1, calls
    spec = parse_spec(f"""
target: {{gpu: h200, arch: sm90}}
models:
  - name: tiny
    dims: {{nheads: 2, headdim: 16, ngroups: 1, dstate: 16, chunk_size: 16}}
batch: [1]
seqlen: [40]
packed_sequences: [{str(packed).lower()}]
dtypes: [bf16]
kernels: [ssd_state_passing_bwd]
""", source="t.yaml")
    combos = {c.key: c for c in plan(spec)}
    assert f2 <= combos.keys(), (f2, sorted(combos))
    (key,) = f2
    assert combos[key].origins == ("tiny tp=1 batch=1 seqlen=40" + (" packed" if packed else "")
                                   + " (run by ssd_state_passing_bwd)",)
    # `sweep --kernel ssd_state_passing_bwd` keeps the F2 call with the walk.
    assert sorted(c.kernel for c in combos.values() if runs_for(c, ["ssd_state_passing_bwd"])) == [
        "ssd_chunk_state", "ssd_state_passing_bwd"]
    assert [c.kernel for c in combos.values() if runs_for(c, ["ssd_chunk_state"])] == ["ssd_chunk_state"]
    # Where the backward walks in one kernel, nothing else is planned for the walk.
    one_walk = parse_spec("""
target: {gpu: h200, arch: sm90}
models:
  - name: wide
    dims: {nheads: 64, headdim: 16, ngroups: 1, dstate: 16, chunk_size: 16}
batch: [1]
seqlen: [40]
dtypes: [bf16]
kernels: [ssd_state_passing_bwd, ssd_chunk_state_passing_bwd]
""", source="t.yaml")
    assert [c.kernel for c in plan(one_walk)] == ["ssd_chunk_state_passing_bwd"]
