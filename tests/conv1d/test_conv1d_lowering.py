"""Every conv1d kernel lowers to Triton for its default config, in both layouts: Helion's real compiler front end, no GPU.

Ref mode accepts kernel bodies that compiled mode rejects, so each kernel is lowered with
every optional input absent and present, widths 2 and 4, fp32 and bf16, contiguous and
channel-last x, and at a real model's sizes (Nemotron-3 Nano's xBC, meta tensors); the
search seeds are checked as `autotune_cli.lowering` checks them. The cases run in worker
processes without HELION_INTERPRET (compiled mode is fixed per process when a kernel is
created): one per core the test has (tests/conftest.py's `lowering_processes`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest
from worker_processes import env_key, run_cases

FLAGS = ("has_bias", "has_seq_idx", "has_initial_states", "has_dinitial_states", "has_dfinal")
# Nemotron-3 Nano's xBC at TP 1: 64 * 64 + 2 * 8 * 128 channels.
NANO = {"batch": 2, "seqlen": 8192, "dim": 6144}


def _conv_dims(layout: int, width: int, flags: dict[str, int], silu: int = 1,
               size: dict[str, int] | None = None) -> dict[str, int]:
    return {**(size or {"batch": 2, "seqlen": 37, "dim": 24}), "width": width, **flags, "silu": silu,
            "channel_last": layout}


def _cases() -> list[tuple[str, str, dict[str, int], str, bool]]:
    cases = []
    off = dict.fromkeys(FLAGS, 0)
    # seq_idx excludes states (the shape contract): one set with states, one with seq_idx.
    states = {**off, "has_bias": 1, "has_initial_states": 1, "has_dinitial_states": 1, "has_dfinal": 1}
    packed = {**off, "has_bias": 1, "has_seq_idx": 1}
    for name in ("causal_conv1d_fwd", "causal_conv1d_bwd_slide", "causal_conv1d_bwd", "causal_conv1d_bwd_dx"):
        # The slide kernel takes channel-last rows only (bwd_slide.fits).
        for layout in (1,) if name == "causal_conv1d_bwd_slide" else (0, 1):
            lay = ("contiguous", "channel_last")[layout]
            for width in (2, 4):
                for fid, flags in (("off", off), ("states", states), ("packed", packed)):
                    cases.append((f"{name}-{lay}-W{width}-{fid}-bf16", name, _conv_dims(layout, width, flags, silu=width % 2),
                                  "bf16", False))
            cases.append((f"{name}-{lay}-W4-packed-fp32", name, _conv_dims(layout, 4, packed), "fp32", False))
        cases.append((f"{name}-nemotron3-nano-bf16", name, _conv_dims(1, 4, packed, size=NANO), "bf16", True))
    for state_len, seqlen in ((3, 1), (4, 1), (8, 3)):
        for cache, idx in ((0, 0), (1, 0), (0, 1), (1, 1)):
            dims = {"batch": 3, "dim": 40, "seqlen": seqlen, "width": 4, "state_len": state_len, "has_bias": 1,
                    "silu": 1, "has_cache_seqlens": cache, "has_state_indices": idx}
            cases.append((f"causal_conv1d_update-S{state_len}-L{seqlen}-cache{cache}-idx{idx}", "causal_conv1d_update",
                          dims, "bf16", False))
    return cases


CASES = _cases()

# Runs in a fresh interpreter in compiled mode: lower each case, print one JSON line each.
_WORKER = r"""
import json, sys, torch
from autotune_cli.lowering import check_seeds, compiled_mode, meta_args, shape_args, triton_source
from autotune_cli.tuning import get
torch.set_num_threads(1)  # two workers share the CI machine's cores
for case_id, name, dims, dtype, meta in json.loads(sys.stdin.read()):
    tk = get(name)
    dims = {k: v for k, v in dims.items() if k in tk.dims}
    try:
        if meta:
            args = meta_args(tk, dims, dtype)
        else:
            args = shape_args(tk, dims, dtype)  # make_problem's layout, no data
        bound = tk.kernel.bind(args)
        code = triton_source(bound, tk.default_for(bound, dims))
        problems = [] if meta else check_seeds(tk, dims, dtype)
        ok = "tl.store" in code and not problems
        result = {"id": case_id, "ok": ok, "error": "; ".join(problems) or ("" if ok else "no store")}
    except Exception as e:  # every compiler error is a finding for this case
        result = {"id": case_id, "ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    print(json.dumps(result), flush=True)
"""


@pytest.fixture(scope="module")
def clean_env() -> dict[str, str]:
    # Module-scoped twin of tests/conftest.py's clean_env (that one is per test).
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env.pop("HELION_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.fixture(scope="module")
def lowered(clean_env: dict[str, str], lowering_processes: int) -> dict[str, dict[str, Any]]:
    # pytest sets a module fixture up again when pytest-xdist runs another module's test between
    # this module's (CI lowered every case twice, 85-125 s each): lower once per process.
    return _lower_cases(env_key(clean_env), lowering_processes)


@functools.cache
def _lower_cases(env_items: tuple[tuple[str, str], ...], n: int) -> dict[str, dict[str, Any]]:
    # A worker that dies is reported with its exit code or signal and peak memory (worker_processes).
    return run_cases(_WORKER, CASES, n, dict(env_items))


@pytest.mark.slow
@pytest.mark.xdist_group("conv1d-lowering")  # one worker runs `lowered` once
@pytest.mark.parametrize("case_id", [c[0] for c in CASES])
def test_default_config_lowers(lowered: dict[str, dict[str, Any]], case_id: str) -> None:
    assert "__worker__" not in lowered, lowered.get("__worker__", {}).get("error")
    assert case_id in lowered, f"{case_id}: the lowering worker printed no result"
    result = lowered[case_id]
    assert result["ok"], f"{case_id}: {result['error']}"


@pytest.mark.slow
@pytest.mark.xdist_group("conv1d-lowering")
def test_the_lowering_is_found_again_by_a_second_set_up(lowered: dict[str, dict[str, Any]],
                                                         clean_env: dict[str, str], lowering_processes: int) -> None:
    # What `lowered` asks for when pytest sets it up again under another test: the environment
    # differs in PYTEST_CURRENT_TEST alone, and the cases are not lowered a second time.
    again = {**clean_env, "PYTEST_CURRENT_TEST": os.environ["PYTEST_CURRENT_TEST"]}
    assert again != clean_env
    assert _lower_cases(env_key(again), lowering_processes) is lowered
