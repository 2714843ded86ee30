"""The kernels not yet run on a GPU, compiled by Triton down to sm_90 cubins on the CPU.

Lowering (test_config_lowering.py) stops at the generated Triton source; `lowering.compile_for_gpu`
goes on through Triton's compiler and ptxas for an H200, specializing pointers and ints as a launch
there does. Here: the kernels written while no GPU was lent, their default configs
and every search seed, at the real shapes the sweep tunes them at, so that a GPU run does
not start by finding a compile error. The slide conv1d backward steps one row per loop iteration:
its loads must reach the software pipeline (shared-memory stages), or a row per step leaves the
memory system idle. (The test extra pins the H200 host's Triton, 3.6.0, so this is the GPU's compiler.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_COMPILE = r"""
import json, sys
import helion
from autotune_cli import lowering
from autotune_cli.kernel_keys import ModelShape
from autotune_cli.tuning import get

out = []
for name, shape in json.loads(sys.argv[1]):
    tk = get(name)
    dims = tk.dims_for(ModelShape(**shape))
    args = lowering.shape_args(tk, dims, "bf16")
    bound = tk.kernel.bind(args)
    configs = [("default", tk.default_for(bound, dims))]
    configs += [(f"seed {i}", helion.Config.from_dict(c)) for i, c in enumerate(tk.seed_configs(dims))]
    for label, config in configs:
        compiled = lowering.compile_for_gpu(bound, config, args)
        out.append({"kernel": name, "dims": dims, "config": label, "ptx": len(compiled.asm["ptx"]),
                    "cubin": len(compiled.asm["cubin"]), "shared": compiled.metadata.shared,
                    **lowering.ptxas_usage(compiled)})
print(json.dumps(out))
"""

NANO = {"batch": 2, "seqlen": 8192, "nheads": 64, "headdim": 64, "ngroups": 8, "dstate": 128, "chunk_size": 128}
ZAMBA2 = {"batch": 2, "seqlen": 8192, "nheads": 80, "headdim": 64, "ngroups": 1, "dstate": 64, "chunk_size": 256}
CASES = [
    ("causal_conv1d_bwd_slide", NANO),
    ("causal_conv1d_bwd_slide", {**NANO, "packed": True}),
    ("ssd_bwd_dbdc_runs_sum", ZAMBA2),
]


@pytest.mark.slow
def test_the_kernels_new_to_the_gpu_compile_to_sm90_cubins():
    env = {k: v for k, v in os.environ.items() if k != "HELION_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(CASES)], env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    compiled = json.loads(res.stdout.strip().splitlines()[-1])
    for name, _shape in CASES:
        rows = [r for r in compiled if r["kernel"] == name]
        assert len(rows) >= 2 and all(r["cubin"] > 0 for r in rows), name  # the default and the seeds
    slide_defaults = [r for r in compiled if r["kernel"] == "causal_conv1d_bwd_slide" and r["config"] == "default"]
    assert len(slide_defaults) == 2
    for r in slide_defaults:
        # x's and dout's rows staged ahead: (stages - 1) x 2 rows x 256 channels x 2 bytes, at least.
        assert r["shared"] >= 2 * 2 * 256 * 2, r
        # The rows kept from the steps before fit in registers: no spills (44 registers a thread
        # with the CPU install's Triton 3.9, against 234 for the two kernels' first).
        assert r["spill_stores"] == r["spill_loads"] == 0, r
    print("\n" + "\n".join(f"{r['kernel']} {r['config']}: {r['registers']} registers, {r['shared']} B shared, "
                             f"spills {r['spill_stores']}/{r['spill_loads']} B" for r in compiled))


_COMPILE_AT_DIMS = r"""
import json, sys
from autotune_cli import lowering
from autotune_cli.tuning import get

for name, dims, dtype in json.loads(sys.argv[1]):
    tk = get(name)
    args = lowering.shape_args(tk, dims, dtype)
    bound = tk.kernel.bind(args)
    compiled = lowering.compile_for_gpu(bound, tk.default_for(bound, dims), args)
    print(name, len(compiled.asm["cubin"]))
"""

# causal-conv1d's own test suite on an H100: dim 64, seqlen 16, width 2, no bias, SiLU, fp32,
# channel-last, initial states with their gradient. At width 2 the initial states are one
# column, and the dx kernel's dinitial_states store did not compile ("Expected pointer argument
# to have shape [64, 16] but got [64, 1]"): the backward writes them into two (`dinit_buffer`).
_SUITE = {"batch": 2, "seqlen": 16, "dim": 64, "width": 2, "has_seq_idx": 0, "channel_last": 1}
DIMS_CASES = [
    ("causal_conv1d_bwd_dx", {**_SUITE, "has_dinitial_states": 1, "has_dfinal": 0}, "fp32"),
    ("causal_conv1d_bwd_dx", {**_SUITE, "has_dinitial_states": 1, "has_dfinal": 1}, "fp32"),
    ("causal_conv1d_bwd", {**_SUITE, "has_bias": 0, "has_initial_states": 1, "silu": 1}, "fp32"),
    ("causal_conv1d_fwd", {**_SUITE, "has_bias": 0, "has_initial_states": 1, "silu": 1}, "fp32"),
]


@pytest.mark.slow
def test_the_conv1d_backward_with_one_initial_state_column_compiles_to_sm90():
    env = {k: v for k, v in os.environ.items() if k != "HELION_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _COMPILE_AT_DIMS, json.dumps(DIMS_CASES)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert len(res.stdout.strip().splitlines()) == len(DIMS_CASES)
