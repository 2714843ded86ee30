"""A search whose budget ran out before any config was timed: it is retried once in the same
process with its budget plus the seconds it ran (its first configs are compiled by then), and a
failure says so and what to change, instead of Helion's bare "No working config found" (on the
H200, 12 s searches of the dB/dC backward at one group failed so: its 19 seeds take longer than
that to compile). A search whose configs Helion's accuracy check rejected is not retried, and its
failure names the check (47B's first dB/dC pass on the H200: every config differed
from the default's where its S buffer was never written)."""

from __future__ import annotations

import helion
import pytest

from autotune_cli.spec import Budget
from autotune_cli.tuner import budget_ran_out, no_config_reason, retry_budget

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


def test_accuracy_rejections_name_the_check_not_the_budget():
    reason = no_config_reason(NO_CONFIG, 94.5, 90, {"accuracy_error": 40, "timeout": 3})
    assert "Helion's accuracy check rejected 40 of the configs it ran (dropped: 40 accuracy_error, 3 timeout)" in reason
    assert "partly unwritten" in reason
    assert "budget ran out" not in reason and "--seconds-per-combo" not in reason


def test_other_drops_are_listed():
    assert no_config_reason(NO_CONFIG, 5.0, 12, {"timeout": 2, "error": 1}) == (
        "autotune failed: NoConfigFound: No working config found from autotuning (dropped: 1 error, 2 timeout)")
    assert no_config_reason(NO_CONFIG, 12.5, 12, {"timeout": 2}).endswith("budget.seconds_per_combo in the spec) (dropped: 2 timeout)")


def test_the_retry_gets_its_budget_plus_the_seconds_the_first_search_ran():
    budget = Budget(effort="quick", seconds_per_combo=30, seed=3)
    retry = retry_budget(budget, 78.5)
    assert retry.seconds_per_combo == 109
    assert retry.model_copy(update={"seconds_per_combo": 30}) == budget  # nothing else changes
    assert retry_budget(budget, 30.0).seconds_per_combo == 60


@pytest.mark.parametrize("spent,budget_s,ran_out", [(12.9, 12, True), (12.0, 12, True), (11.9, 12, False),
                                                     (500.0, None, False)])
def test_a_budget_ran_out_when_the_search_used_all_of_it(spent, budget_s, ran_out):
    assert budget_ran_out(spent, budget_s) is ran_out


@pytest.mark.gpu
def test_a_real_search_whose_budget_ran_out_is_retried_once_with_more(capfd):
    """The dB/dC backward at Zamba2's one group with a 1 s search: its seeds cannot compile in
    that time, so the first search times nothing; the retry, with 1 s plus what the first ran and
    its seeds compiled, yields an entry that records the budget it got."""
    from autotune_cli.spec import DEFAULT_TOLERANCES
    from autotune_cli.tuner import tune
    from autotune_cli.tuning import ModelShape, get

    shape = ModelShape(batch=2, seqlen=8192, nheads=80, headdim=64, ngroups=1, dstate=64, chunk_size=256)
    tk = get("ssd_chunk_state_scan_bwd_dbdc")
    out = tune(tk.name, tk.dims_for(shape), "bf16", Budget(effort="quick", seconds_per_combo=1),
               DEFAULT_TOLERANCES["bf16"])
    err = capfd.readouterr().err
    assert "search budget ran out" in err and "retrying once with a" in err, err[-2000:]
    assert out.entry is not None, out.failure
    assert out.entry.search.budget_seconds > 1 and out.entry.accuracy.passed
