"""Kernels compiled by Triton down to sm_90 cubins on the CPU, at shapes a GPU session has failed at.

Lowering (test_config_lowering.py) stops at the generated Triton source; `lowering.compile_for_gpu`
goes on through Triton's compiler and ptxas for an H200, specializing pointers and ints as a launch
there does. (The test extra pins the H200 host's Triton, 3.6.0, so this is the GPU's compiler.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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
