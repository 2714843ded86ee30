"""Every SSD kernel (forward and backward) lowers to Triton for its default config (the one the
runtime runs without an entry): Helion's real compiler front end, no GPU.

Ref mode accepts kernel bodies that compiled mode rejects (a host tensor inside hl.tile, a
conditional expression over an optional tensor, ...), so each kernel is also lowered at
several shapes and option sets: seqlen not a multiple of chunk_size, ngroups 1 and > 1,
one head, odd sizes, every optional input absent and present, and a real model's sizes.

Lowering needs Helion's compiled mode, which is fixed per process when a kernel is
created; the session may be in ref mode (tests/conftest.py), so the cases run in worker
processes without HELION_INTERPRET (one per core the test has: tests/conftest.py's
`lowering_processes`), once per module.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from worker_processes import env_key, run_cases

from mamba_tune.keys import bwd_partials

# (batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size)
SHAPES = {
    "L100-Q32-G2": (1, 100, 4, 16, 2, 16, 32),  # seqlen % chunk_size != 0
    "odd-H3-G1-N8": (2, 48, 3, 24, 1, 8, 16),  # odd sizes, dstate < 16
    "H1-P64-N128": (1, 64, 1, 64, 1, 128, 64),  # one head, exact chunks
}
NEMOTRON_NANO = (2, 8192, 64, 64, 8, 128, 128)
FLAGS = ("has_dt_bias", "dt_softplus", "has_D", "has_z", "has_seq_idx", "has_initial_states", "has_dfinal")
STAGES = ("ssd_chunk_cumsum", "ssd_chunk_state", "ssd_chunk_state_passing", "ssd_bmm",
          "ssd_chunk_scan", "ssd_chunk_state_passing_bwd", "ssd_state_passing_bwd", "ssd_chunk_scan_chunk_state_bwd_dx",
          "ssd_chunk_state_scan_bwd_dbdc", "ssd_chunk_cumsum_bwd")


def _dims(shape: tuple[int, ...], flags: int) -> dict[str, int]:
    b, L, H, P, G, N, Q = shape
    return {"batch": b, "seqlen": L, "nheads": H, "headdim": P, "ngroups": G, "dstate": N, "chunk_size": Q,
            **dict.fromkeys(FLAGS, flags), **bwd_partials(P, N)}


def _cases() -> list[tuple[str, str, dict[str, int], str]]:
    cases = []
    for stage in STAGES:
        # Every optional input absent and present at the first shape, one set at the others.
        for (shape_id, shape), flags in (*(((k, v), 0) for k, v in list(SHAPES.items())[:1]),
                                         *(((k, v), 1) for k, v in SHAPES.items())):
            cases.append((f"{stage}-{shape_id}-flags{flags}-bf16", stage, _dims(shape, flags), "bf16"))
        cases.append((f"{stage}-L100-Q32-G2-flags1-fp32", stage, _dims(SHAPES["L100-Q32-G2"], 1), "fp32"))
        cases.append((f"{stage}-nemotron3-nano-mixer-bf16", stage,
                      {**_dims(NEMOTRON_NANO, 0), "has_dt_bias": 1, "dt_softplus": 1, "has_D": 1}, "bf16"))
    return cases


CASES = _cases()

# Runs in a fresh interpreter in compiled mode: lower each case, print one JSON line each.
_WORKER = r"""
import json, sys, torch
from autotune_cli.lowering import shape_args, triton_source
from autotune_cli.tuning import get
torch.set_num_threads(1)  # two workers share the CI machine's cores
for case_id, stage, dims, dtype in json.loads(sys.stdin.read()):
    tk = get(stage)
    dims = {k: v for k, v in dims.items() if k in tk.dims}
    if stage == "ssd_state_passing_bwd":  # its seqlen is the padded length
        dims["seqlen"] = -(-dims["seqlen"] // dims["chunk_size"]) * dims["chunk_size"]
    try:
        bound = tk.kernel.bind(shape_args(tk, dims, dtype))  # make_problem's layout, no data
        # The config the runtime runs without an entry: the kernel's own default where it names
        # one (the backward kernels do), else Helion's.
        code = triton_source(bound, tk.default_for(bound, dims))
        result = {"id": case_id, "ok": "tl.store" in code, "error": "" if "tl.store" in code else "no store",
                  "least_blocks": [s.min_size for s in bound.config_spec.block_sizes]}
    except Exception as e:  # every compiler error is a finding for this case
        result = {"id": case_id, "ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    print(json.dumps(result), flush=True)
"""


@pytest.fixture(scope="module")
def lowered(clean_env: dict[str, str], lowering_processes: int) -> dict[str, dict[str, Any]]:
    # pytest sets a module fixture up again when pytest-xdist runs another module's test between
    # this module's (CI lowered every case twice, 85-125 s each): lower once per process.
    return _lower_cases(env_key(clean_env), lowering_processes)


@functools.cache
def _lower_cases(env_items: tuple[tuple[str, str], ...], n: int) -> dict[str, dict[str, Any]]:
    # A worker that dies is reported with its exit code or signal and peak memory (worker_processes).
    return run_cases(_WORKER, CASES, n, dict(env_items))


@pytest.fixture(scope="module")
def clean_env() -> dict[str, str]:
    # Module-scoped twin of tests/conftest.py's clean_env (that one is per test).
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env.pop("HELION_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.mark.slow
@pytest.mark.xdist_group("ssd-lowering")  # one worker runs `lowered` once
@pytest.mark.parametrize("case_id", [c[0] for c in CASES])
def test_default_config_lowers(lowered: dict[str, dict[str, Any]], case_id: str) -> None:
    assert "__worker__" not in lowered, lowered.get("__worker__", {}).get("error")
    assert case_id in lowered, f"{case_id}: the lowering worker printed no result"
    result = lowered[case_id]
    assert result["ok"], f"{case_id}: {result['error']}"


# The dx kernel writes one slot of rows per headdim block, the dB/dC kernel one per dstate block
# (block_sizes[1] of each); the launcher sizes rows for the most blocks any config can make. A
# config with more blocks than slots would write past rows on the GPU: the blocks' registered least
# must be the launcher's.
SLOT_BLOCKS = {"ssd_chunk_scan_chunk_state_bwd_dx": ("headdim", "SLOT_P"), "ssd_chunk_state_scan_bwd_dbdc": ("dstate", "SLOT_N")}


@pytest.mark.slow
@pytest.mark.xdist_group("ssd-lowering")
@pytest.mark.parametrize("case_id", [c[0] for c in CASES if c[1] in SLOT_BLOCKS])
def test_slot_blocks_are_at_least_the_launchers(lowered: dict[str, dict[str, Any]], case_id: str) -> None:
    from mamba_tune import keys

    _, stage, dims, _ = next(c for c in CASES if c[0] == case_id)
    dim, cap = SLOT_BLOCKS[stage]
    assert lowered[case_id]["ok"], lowered[case_id]["error"]
    least = lowered[case_id]["least_blocks"][1]
    assert least == keys.slot_block(dims[dim], getattr(keys, cap)), (case_id, least)
    assert -(-dims[dim] // least) <= keys.row_slots(dims["headdim"], dims["dstate"])
