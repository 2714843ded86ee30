"""A search's trace from Helion's own autotune log: the improvement frontier, what was dropped,
compile time, when it came within 1% of its best; the bundle field that keeps it; the line the
tuner prints. The log files here are written by Helion's own log sink (the class a search
writes with), with the times and outcomes a search would give them."""

from __future__ import annotations

import json
from pathlib import Path

import helion
import pytest
from bundles import bundle, entry
from helion.autotuner.logger import AutotuneLogEntry, AutotuneLogSink

from autotune_cli.search_trace import (
    describe_search_log,
    frontier,
    read_helion_log,
    seconds_to_within,
    within_1pct_note,
)

# (seconds into the search, status, ms, compile seconds), in the order a search logs them.
ROWS = [
    (0.5, "started", None, None),
    (1.0, "ok", 0.90, 2.0),
    (1.2, "error", None, 1.5),
    (2.0, "ok", 0.70, 2.5),
    (2.1, "deduplicated", 0.70, None),
    (3.0, "ok", 0.75, 1.0),  # no better: not on the frontier
    (4.0, "timeout", None, 30.0),
    (5.0, "ok", 0.5040, 2.0),
    (9.0, "ok", 0.5000, 2.0),  # the final best; 0.504 was within 1% of it at 5.0 s
    (9.5, "accuracy_error", 0.1, 1.0),  # fast but wrong: dropped, not the best
]


def _write_log(base: Path, rows: list[tuple[float, str, float | None, float | None]]) -> Path:
    sink = AutotuneLogSink(str(base))
    sink.open()
    sink.start_run()
    t0 = sink._run_start_time  # the sink stamps each row with completed_at - the run's start
    for i, (t, status, ms, compile_s) in enumerate(rows):
        cfg = helion.Config(block_sizes=[16 * (i + 1)], num_warps=4)
        sink.record(AutotuneLogEntry(generation=i // 4, status=status, perf_ms=ms, compile_time=compile_s,
                                     config_id=f"c{i}", config=cfg, completed_at=t0 + t))
    sink.close()
    return base.with_suffix(".csv")


def test_helions_log_becomes_the_frontier_and_the_counts(tmp_path: Path) -> None:
    log = read_helion_log(_write_log(tmp_path / "search", ROWS))
    assert log is not None
    assert log.trace == ((1.0, 0.90), (2.0, 0.70), (5.0, 0.5040), (9.0, 0.5000))
    assert log.benchmarked == 5
    assert log.dropped == {"accuracy_error": 1, "error": 1, "timeout": 1}
    assert log.compile_seconds == pytest.approx(42.0)
    assert log.span_seconds == pytest.approx(9.5)
    assert log.configs_per_minute() == pytest.approx(60 * 5 / 9.5)
    assert seconds_to_within(log.trace, 1.0) == 5.0
    assert seconds_to_within(log.trace, 0.0) == 9.0
    assert seconds_to_within(log.trace, 50.0) == 2.0
    line = describe_search_log(log)
    assert line == ("5 configs benchmarked in 9.5 s (32 a minute), dropped: 1 accuracy_error, 1 error, 1 timeout; "
                    "compiles 42.0 s summed; within 1% of its best at 5.0 s")


def test_no_log_or_an_empty_one_is_no_trace(tmp_path: Path) -> None:
    assert read_helion_log(tmp_path / "missing.csv") is None
    empty = _write_log(tmp_path / "empty", [])
    assert empty.read_text().startswith("run_id,timestamp_s")  # Helion's header, no rows
    assert read_helion_log(empty) is None
    only_failures = read_helion_log(_write_log(tmp_path / "bad", [(1.0, "error", None, 3.0)]))
    assert only_failures is not None and only_failures.trace == () and only_failures.benchmarked == 0
    assert seconds_to_within(only_failures.trace, 1.0) is None
    assert "within 1%" not in describe_search_log(only_failures)


def test_frontier_sorts_by_time_and_keeps_strict_improvements() -> None:
    assert frontier([(3.0, 1.0), (1.0, 2.0), (2.0, 2.0), (4.0, 1.0), (5.0, 0.5)]) == ((1.0, 2.0), (3.0, 1.0),
                                                                                      (5.0, 0.5))
    assert frontier([]) == ()


def test_the_bundle_keeps_the_trace_and_reads_bundles_without_it(tmp_path: Path) -> None:
    from mamba_tune.bundle import load_bundle, write_bundle

    e = entry()
    traced = e.model_copy(update={"search": e.search.model_copy(update={"trace": [(1.0, 0.2), (4.5, 0.1)]})})
    path = tmp_path / "b.json"
    write_bundle(bundle(traced), path)
    assert json.loads(path.read_text())["entries"][traced.key]["search"]["trace"] == [[1.0, 0.2], [4.5, 0.1]]
    assert load_bundle(path).entries[traced.key].search.trace == [(1.0, 0.2), (4.5, 0.1)]
    write_bundle(bundle(e), path)
    assert "trace" not in json.loads(path.read_text())["entries"][e.key]["search"]  # as before the field
    assert load_bundle(path).entries[e.key].search.trace is None


def test_show_says_when_each_search_came_within_1pct(tmp_path: Path) -> None:
    """`mamba-tune show` gives each traced entry's time to within 1% of its best; an entry
    without a trace shows none."""
    from typer.testing import CliRunner

    from autotune_cli.app import app
    from mamba_tune.bundle import write_bundle

    e = entry()
    traced = e.model_copy(update={"search": e.search.model_copy(update={"trace": [(3.0, 0.2), (7.0, 0.1005), (12.0, 0.1)]})})
    path = tmp_path / "b.json"
    write_bundle(bundle(traced), path)
    r = CliRunner().invoke(app, ["show", str(path)])
    assert r.exit_code == 0, r.output
    assert "within 1% at" in r.output  # the table may fold the cell after this
    assert within_1pct_note(traced.search.trace) == ", within 1% at 7 s"
    write_bundle(bundle(e), path)
    r = CliRunner().invoke(app, ["show", str(path)])
    assert r.exit_code == 0 and "within 1%" not in r.output


@pytest.mark.gpu
def test_a_real_search_leaves_its_trace(capsys: pytest.CaptureFixture[str]) -> None:
    """A quick search of the tiny spec's norm forward on the GPU: the entry's trace comes from
    Helion's log (times rising, best falling) and the tuner prints its summary line."""
    from autotune_cli.plan import plan
    from autotune_cli.spec import load_spec
    from autotune_cli.tuner import tune

    spec = load_spec(Path(__file__).parents[1] / "data" / "tiny.yaml")
    budget = spec.budget.model_copy(update={"effort": "quick", "seconds_per_combo": 15})
    combo = next(c for c in plan(spec) if c.kernel == "gated_norm_fwd")
    out = tune(combo.kernel, combo.dims, combo.dtype, budget, spec.tolerances[combo.dtype])
    assert out.entry is not None, out.failure
    trace = out.entry.search.trace
    assert trace, "no trace from Helion's autotune log"
    assert all(a[0] <= b[0] and a[1] > b[1] for a, b in zip(trace, trace[1:]))
    assert "search log: " in capsys.readouterr().err


def test_searches_says_which_came_within_one_percent_sooner(tmp_path: Path) -> None:
    """`mamba-tune searches A B` on two bundles of the same combo (cold and warm-started
    searches): each final best, and when each came within 1% of the better one."""
    from typer.testing import CliRunner

    from autotune_cli.app import app
    from mamba_tune.bundle import write_bundle

    e = entry()

    def traced(trace: list[tuple[float, float]]):  # noqa: ANN202
        return bundle(e.model_copy(update={"search": e.search.model_copy(update={"trace": trace})}))

    cold, warm, other = tmp_path / "cold.json", tmp_path / "warm.json", tmp_path / "other.json"
    write_bundle(traced([(2.0, 0.30), (30.0, 0.105), (50.0, 0.1004)]), cold)
    write_bundle(traced([(1.0, 0.1009), (20.0, 0.1)]), warm)
    r = CliRunner().invoke(app, ["searches", str(cold), str(warm)])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == (f"{e.key}: final best A 0.1004 ms, B 0.1000 ms; within 1% of 0.1000 ms: "
                                "A 50.0 s, B 1.0 s (A / B 50.00x)")
    r = CliRunner().invoke(app, ["searches", str(cold), str(warm), "--pct", "0"])
    assert r.exit_code == 0 and "A never, B 20.0 s (A / B -)" in r.output, r.output
    other.write_text("{}", encoding="utf-8")
    r = CliRunner().invoke(app, ["searches", str(cold), str(other)])
    assert r.exit_code == 2 and str(other) in r.output and len(r.output.strip().splitlines()) == 1, r.output
    write_bundle(bundle(), other)  # no entry in common: nothing to compare
    r = CliRunner().invoke(app, ["searches", str(cold), str(other)])
    assert r.exit_code == 1 and "share no entry" in r.output, r.output


def test_the_sweeps_combo_line_says_when_the_search_came_within_one_percent() -> None:
    from autotune_cli.sweep_job import describe_entry

    e = entry()
    assert "within 1%" not in describe_entry(e)
    traced = e.model_copy(update={"search": e.search.model_copy(update={"trace": [(3.0, 0.2), (14.2, 0.1)]})})
    assert describe_entry(traced).endswith("; the search within 1% of its best at 14 s of 60 s)")


def test_the_sweeps_combo_line_says_when_the_search_timed_one_config() -> None:
    """A search whose starting configs' compiles took the budget measured one config: the line says
    so and names the option that gives it time (the H100 sweep's 8 s searches of ssd_chunk_scan)."""
    from autotune_cli.sweep_job import describe_entry

    e = entry()
    one = e.model_copy(update={"search": e.search.model_copy(update={
        "configs_tried": 1, "budget_seconds": 8, "seconds": 15.6, "trace": [(15.2, 0.12)]})})
    assert describe_entry(one).endswith(
        "; the search timed 1 config in 16 s: its compiles took the 8 s budget, raise --seconds-per-combo to search)")
    assert "timed 1 config" not in describe_entry(e)
    none = one.model_copy(update={"search": one.search.model_copy(update={"algorithm": "none"})})
    assert "timed 1 config" not in describe_entry(none)
