"""A search whose budget ran out before any config was timed: the failure says so and what to
change, instead of Helion's bare "No working config found" (on the H200, 12 s searches of the
dB/dC backward at one group failed so: its 19 seeds take longer than that to compile)."""

from __future__ import annotations

import helion
import pytest

from autotune_cli.tuner import no_config_reason

NO_CONFIG = helion.exc.NoConfigFound()


def test_a_spent_budget_names_the_budget_and_the_option():
    reason = no_config_reason(NO_CONFIG, 12.9, 12)
    assert reason.startswith("autotune failed: NoConfigFound: No working config found from autotuning: ")
    assert "the 12 s search budget ran out (12.9 s) before any config was timed" in reason
    assert "--seconds-per-combo" in reason and "budget.seconds_per_combo" in reason


@pytest.mark.parametrize("spent,budget_s", [(5.0, 12), (None, 12), (30.0, None)],
                         ids=["within-budget", "clock-unknown", "no-budget"])
def test_otherwise_the_reason_is_helions(spent, budget_s):
    assert no_config_reason(NO_CONFIG, spent, budget_s) == "autotune failed: NoConfigFound: No working config found from autotuning"


@pytest.mark.gpu
def test_a_real_search_with_too_short_a_budget_fails_with_that_reason():
    """The dB/dC backward at Zamba2's one group with a 1 s search: its seeds cannot compile in
    that time, so no config is timed and the combo fails, naming the budget."""
    from autotune_cli.spec import DEFAULT_TOLERANCES, Budget
    from autotune_cli.tuner import tune
    from autotune_cli.tuning import ModelShape, get

    shape = ModelShape(batch=2, seqlen=8192, nheads=80, headdim=64, ngroups=1, dstate=64, chunk_size=256)
    tk = get("ssd_chunk_state_scan_bwd_dbdc")
    out = tune(tk.name, tk.dims_for(shape), "bf16", Budget(effort="quick", seconds_per_combo=1),
               DEFAULT_TOLERANCES["bf16"])
    assert out.entry is None and out.failure is not None
    assert "search budget ran out" in out.failure.reason, out.failure.reason
