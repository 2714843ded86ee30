"""What a search did, from Helion's own autotune log: best-so-far against time, and where its time went.

Helion (1.5) writes one CSV row per config it handles when `settings.autotune_log` names a
base path (`<base>.csv`, with `<base>.log`): the seconds since the search's start, the
config's generation, a status ("ok" for a config it benchmarked, "error", "timeout",
"accuracy_error", ... for one it dropped; "started" marks a benchmark begun), the measured
milliseconds and the config's compile seconds. The tuner points every search at such a base
path and keeps, in the bundle entry's `search.trace`, the improvement frontier: [seconds into
the search, best milliseconds so far] at each config that beat every earlier one. `mamba-tune
report` draws it, and says how long each search took to come within 1% of where it ended;
`mamba-tune searches A B` sets two searches of the same combos side by side (`compare`).
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Statuses Helion gives a config that was benchmarked and measured.
MEASURED = frozenset(("ok",))
# Statuses that say nothing about a config's outcome.
NOT_OUTCOMES = frozenset(("started", "deduplicated"))
# The status of a config whose results differed from the default config's (Helion's accuracy check).
ACCURACY_ERROR = "accuracy_error"


@dataclasses.dataclass(frozen=True)
class SearchLog:
    """One search's log, summed up."""

    trace: tuple[tuple[float, float], ...]  # (seconds, best ms so far) at each improvement
    benchmarked: int  # configs measured ("ok")
    dropped: dict[str, int]  # configs dropped, by Helion's status
    compile_seconds: float  # summed over the configs (compiles run in parallel: can exceed the span)
    span_seconds: float  # the last row's time

    def configs_per_minute(self) -> float | None:
        return None if self.span_seconds <= 0 else 60.0 * self.benchmarked / self.span_seconds


def read_helion_log(csv_path: str | Path) -> SearchLog | None:
    """The summary of Helion's autotune CSV at csv_path; None if the file is missing or has no
    rows (a search that never started)."""
    path = Path(csv_path)
    if not path.is_file():
        return None
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    timed = []
    dropped: Counter[str] = Counter()
    compile_s = 0.0
    span = 0.0
    for r in rows:
        t = _float(r.get("timestamp_s"))
        status = (r.get("status") or "").strip()
        ms = _float(r.get("perf_ms"))
        if t is not None:
            span = max(span, t)
        c = _float(r.get("compile_time_s"))
        if c is not None and status not in NOT_OUTCOMES:
            compile_s += c
        if status in MEASURED and ms is not None and t is not None:
            timed.append((t, ms))
        elif status and status not in NOT_OUTCOMES and status not in MEASURED:
            dropped[status] += 1
    return SearchLog(trace=frontier(timed), benchmarked=len(timed), dropped=dict(sorted(dropped.items())),
                     compile_seconds=round(compile_s, 2), span_seconds=round(span, 2))


def frontier(points: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """(seconds, best ms so far) at each measurement that beat every earlier one, in time order."""
    out: list[tuple[float, float]] = []
    for t, ms in sorted(points):
        if not out or ms < out[-1][1]:
            out.append((round(t, 2), ms))
    return tuple(out)


def seconds_to_within(trace: Sequence[Sequence[float]], pct: float) -> float | None:
    """When the search's best first came within pct percent of its final best (None: no trace)."""
    if not trace:
        return None
    final = trace[-1][1]
    return next(float(t) for t, ms in trace if ms <= final * (1 + pct / 100.0))


def within_1pct_note(trace: Sequence[Sequence[float]] | None) -> str:
    """", within 1% at T s" for a table cell: when the search came within 1% of its best
    (empty without a trace)."""
    w = seconds_to_within(trace or (), 1.0)
    return "" if w is None else f", within 1% at {w:.0f} s"


def adopted_note(adopted_from: str | None) -> str:
    """The marker of an entry whose config was adopted from a sibling SKU's entry with no search
    (`sweep --adopt-sibling`; Search.adopted_from), for `show`, `diff` and the sweep's lines; empty
    for a searched entry."""
    return "" if adopted_from is None else f"adopted from {adopted_from} (no search)"


def compare(a: Mapping[str, Any], b: Mapping[str, Any], pct: float) -> list[str]:
    """Two bundles' searches of the keys both hold (entries by key), one line each in key order:
    each final best, and the seconds each took to come within pct percent of the better of the
    two ("never" where it did not), with the ratio A / B."""

    def fmt(s: float | None) -> str:
        return "never" if s is None else f"{s:.1f} s"

    lines = []
    for key in sorted(set(a) & set(b)):
        ta, tb = a[key].search.trace, b[key].search.trace
        if not ta or not tb:
            lines.append(f"{key}: no trace in {'A' if not ta else 'B'}")
            continue
        best = min(ta[-1][1], tb[-1][1])
        target = best * (1 + pct / 100)
        sa = next((float(t) for t, ms in ta if ms <= target), None)
        sb = next((float(t) for t, ms in tb if ms <= target), None)
        ratio = f"{sa / sb:.2f}x" if sa is not None and sb else "-"
        lines.append(f"{key}: final best A {ta[-1][1]:.4f} ms, B {tb[-1][1]:.4f} ms; within {pct:g}% of "
                     f"{best:.4f} ms: A {fmt(sa)}, B {fmt(sb)} (A / B {ratio})")
    return lines


def _float(v: str | None) -> float | None:
    try:
        x = float(v) if v not in (None, "") else None
    except ValueError:
        return None
    return x if x is not None and math.isfinite(x) else None


def describe_search_log(log: SearchLog) -> str:
    """One line: what the search measured, dropped and compiled, and when it came within 1%."""
    rate = log.configs_per_minute()
    dropped = ", ".join(f"{n} {status}" for status, n in log.dropped.items()) or "none"
    w = seconds_to_within(log.trace, 1.0)
    return (f"{log.benchmarked} configs benchmarked in {log.span_seconds:.1f} s"
            + (f" ({rate:.0f} a minute)" if rate is not None else "")
            + f", dropped: {dropped}; compiles {log.compile_seconds:.1f} s summed"
            + (f"; within 1% of its best at {w:.1f} s" if w is not None else ""))
