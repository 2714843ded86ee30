"""When a config breaks a worker's CUDA context mid-search, the sweep retries the combo once
in a fresh worker with Helion's spawn precompile (sweep.isolated_retry)."""

from __future__ import annotations

from autotune_cli.sweep import ISOLATED_ENV, isolated_retry

LOST = {"error": "autotune failed: TritonUnrecoverableRuntimeError: CUDA error: misaligned address",
        "context_lost": True}


def test_a_lost_context_is_retried_once_isolated():
    assert isolated_retry(LOST, isolated=False, environ={})
    # The retry itself ran isolated: a second loss is recorded as the failure.
    assert not isolated_retry(LOST, isolated=True, environ={})
    # Spawn precompile was already on for every worker: a retry would run the same search.
    assert not isolated_retry(LOST, isolated=False, environ=dict([ISOLATED_ENV]))
    assert isolated_retry(LOST, isolated=False, environ={ISOLATED_ENV[0]: "fork"})


def test_other_failures_are_not_retried():
    assert not isolated_retry({"error": "autotune failed: AutotuneError: no config compiled"}, False, {})
    assert not isolated_retry({"entry": None, "failure": {"reason": "numerics"}, "kernel": {}}, False, {})

