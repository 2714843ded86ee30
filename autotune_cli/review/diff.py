"""What changed between two bundle sets: entries, configs, timings, failures, provenance.

Bundles are matched by relative path (two folders) or taken as a pair (two files). Per
entry key an entry is added, removed, changed or unchanged; a changed entry lists the
parts that differ (config, timing, speedup, accuracy, search; `tuned_at` alone is not a
change) and every config field that differs, old -> new. A regression is an entry
present on both sides that got slower (tuned_ms) by more than a threshold, or lost
more than that fraction of its speedup vs the baseline (mamba-ssm).

Times recorded on different cards do not compare: where a pair's bundles name different GPU
SKUs (generated_configs/h200 against generated_configs/h100, the review of a new SKU's
bundles), its entries' times are listed but not counted as faster or slower and never make a
regression; the summary says so and names the command that compares the configs on one card
(`mamba-tune verify NEW --against OLD`).

Three renderings: a rich table for the terminal, markdown for a PR comment (a summary
line, then sections), and JSON for machines.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any, Literal

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from autotune_cli.review.sources import BundleSet, SourceError
from autotune_cli.search_trace import adopted_note
from mamba_tune.bundle import Bundle, Entry, Failure

# Provenance fields that change on every run and say nothing about the configs.
_PROVENANCE_NOISE = {"created", "updated", "git_sha"}
_ENTRY_PARTS = ("config", "timing", "speedup", "accuracy", "search")


@dataclasses.dataclass(frozen=True)
class Change:
    """One field that differs. None: the field is absent on that side."""

    field: str
    old: Any
    new: Any


@dataclasses.dataclass(frozen=True)
class EntryDiff:
    key: str
    kind: Literal["added", "removed", "changed", "unchanged"]
    old: Entry | None
    new: Entry | None
    parts: tuple[str, ...] = ()  # which of _ENTRY_PARTS differ
    config: tuple[Change, ...] = ()
    cards: tuple[str, str] | None = None  # (old SKU, new SKU) where the two were timed on different cards

    @property
    def tuned_ms_pct(self) -> float | None:
        """Change of the tuned time in percent (positive: slower); None across cards."""
        if self.old is None or self.new is None or self.cards is not None:
            return None
        return (self.new.timing.tuned_ms / self.old.timing.tuned_ms - 1.0) * 100.0

    @property
    def vs_default_delta(self) -> float | None:
        if self.old is None or self.new is None:
            return None
        return self.new.speedup.vs_default - self.old.speedup.vs_default

    @property
    def vs_baseline_delta(self) -> float | None:
        if self.old is None or self.new is None:
            return None
        a, b = self.old.speedup.vs_baseline, self.new.speedup.vs_baseline
        return None if a is None or b is None else b - a

    @property
    def vs_baseline_loss_pct(self) -> float | None:
        """Speedup vs the baseline lost, in percent of the old speedup (positive: worse); None across cards."""
        if self.old is None or self.new is None or self.cards is not None:
            return None
        a, b = self.old.speedup.vs_baseline, self.new.speedup.vs_baseline
        return None if a is None or b is None else (a - b) / a * 100.0


@dataclasses.dataclass(frozen=True)
class FailureDiff:
    key: str
    kind: Literal["added", "removed", "changed"]
    old: Failure | None
    new: Failure | None


@dataclasses.dataclass(frozen=True)
class BundleDiff:
    path: str
    status: Literal["added", "removed", "both"]
    provenance: tuple[Change, ...]
    entries: tuple[EntryDiff, ...]  # every key of either side, unchanged ones too
    failures: tuple[FailureDiff, ...]

    def of_kind(self, kind: str) -> list[EntryDiff]:
        return [e for e in self.entries if e.kind == kind]

    @property
    def has_changes(self) -> bool:
        return (self.status != "both" or bool(self.provenance) or bool(self.failures)
                or any(e.kind != "unchanged" for e in self.entries))


@dataclasses.dataclass(frozen=True)
class Regression:
    path: str
    key: str
    metric: Literal["tuned_ms", "vs_baseline"]
    old: float
    new: float
    pct: float  # how much worse, in percent (slower, or speedup lost)

    def describe(self) -> str:
        if self.metric == "tuned_ms":
            return f"tuned time {self.old:.4f} -> {self.new:.4f} ms (+{self.pct:.1f}% slower)"
        return f"speedup vs baseline {self.old:.2f}x -> {self.new:.2f}x (-{self.pct:.1f}%)"


@dataclasses.dataclass(frozen=True)
class Diff:
    old_label: str
    new_label: str
    bundles: tuple[BundleDiff, ...]

    def entries(self, kind: str) -> list[tuple[str, EntryDiff]]:
        return [(b.path, e) for b in self.bundles for e in b.entries if e.kind == kind]

    def summary(self) -> dict[str, int]:
        changed = self.entries("changed")
        pcts = [e.tuned_ms_pct for _, e in changed if e.tuned_ms_pct is not None]
        return {
            "bundles_compared": sum(b.status == "both" for b in self.bundles),
            "bundles_added": sum(b.status == "added" for b in self.bundles),
            "bundles_removed": sum(b.status == "removed" for b in self.bundles),
            "bundles_changed": sum(b.has_changes for b in self.bundles),
            "entries_added": len(self.entries("added")),
            "entries_removed": len(self.entries("removed")),
            "entries_changed": len(changed),
            "entries_unchanged": len(self.entries("unchanged")),
            "configs_changed": sum(bool(e.config) for _, e in changed),
            "faster": sum(p < 0 for p in pcts),
            "slower": sum(p > 0 for p in pcts),
            "other_card": sum(e.cards is not None for _, e in changed + self.entries("unchanged")),
            "failures_added": sum(f.kind == "added" for b in self.bundles for f in b.failures),
            "failures_removed": sum(f.kind == "removed" for b in self.bundles for f in b.failures),
            "failures_changed": sum(f.kind == "changed" for b in self.bundles for f in b.failures),
            "provenance_changes": sum(len(b.provenance) for b in self.bundles),
        }

    @property
    def has_changes(self) -> bool:
        return any(b.has_changes for b in self.bundles)


# --- computing the diff -----------------------------------------------------------------


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(_flatten(value[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[Change, ...]:
    return tuple(Change(k, old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[Change, ...]:
    """Top-level Helion config fields that differ (lists compare whole: block_sizes [32, 64])."""
    return _changes(old, new)


def provenance_changes(old: Bundle, new: Bundle) -> tuple[Change, ...]:
    a = {k: v for k, v in _flatten(old.provenance.model_dump(mode="json")).items()
         if k.split(".")[0] not in _PROVENANCE_NOISE}
    b = {k: v for k, v in _flatten(new.provenance.model_dump(mode="json")).items()
         if k.split(".")[0] not in _PROVENANCE_NOISE}
    return _changes(a, b)


def entry_diff(key: str, old: Entry | None, new: Entry | None, cards: tuple[str, str] | None = None) -> EntryDiff:
    if old is None:
        return EntryDiff(key, "added", None, new)
    if new is None:
        return EntryDiff(key, "removed", old, None)
    a, b = old.model_dump(mode="json"), new.model_dump(mode="json")
    parts = tuple(p for p in _ENTRY_PARTS if a[p] != b[p])
    return EntryDiff(key, "changed" if parts else "unchanged", old, new, parts, config_changes(old.config, new.config),
                     cards)


def bundle_diff(path: str, old: Bundle | None, new: Bundle | None) -> BundleDiff:
    old_entries = old.entries if old else {}
    new_entries = new.entries if new else {}
    skus = (old.provenance.gpu.sku, new.provenance.gpu.sku) if old is not None and new is not None else None
    cards = skus if skus is not None and skus[0] != skus[1] else None
    entries = tuple(entry_diff(k, old_entries.get(k), new_entries.get(k), cards)
                    for k in sorted(set(old_entries) | set(new_entries)))
    old_fail = old.failures if old else {}
    new_fail = new.failures if new else {}
    failures: list[FailureDiff] = []
    for k in sorted(set(old_fail) | set(new_fail)):
        a, b = old_fail.get(k), new_fail.get(k)
        if a is None:
            failures.append(FailureDiff(k, "added", None, b))
        elif b is None:
            failures.append(FailureDiff(k, "removed", a, None))
        elif a.reason != b.reason:
            failures.append(FailureDiff(k, "changed", a, b))
    status: Literal["added", "removed", "both"] = "added" if old is None else "removed" if new is None else "both"
    prov = provenance_changes(old, new) if old is not None and new is not None else ()
    return BundleDiff(path, status, prov, entries, tuple(failures))


def diff_sets(old: BundleSet, new: BundleSet) -> Diff:
    """Pair the bundles of two sets (see the module docstring) and diff each pair."""
    if {old.kind, new.kind} == {"file", "dir"}:
        raise SourceError(f"cannot compare a bundle file with a folder ({old.label} is a {old.kind}, "
                          f"{new.label} is a {new.kind}): give two files or two folders")
    if old.kind == "file" and new.kind == "file":
        (old_name, a), (new_name, b) = next(iter(old.bundles.items())), next(iter(new.bundles.items()))
        path = new_name if old_name == new_name else f"{old_name} -> {new_name}"
        return Diff(old.label, new.label, (bundle_diff(path, a, b),))
    paths = sorted(set(old.bundles) | set(new.bundles))
    return Diff(old.label, new.label,
                tuple(bundle_diff(p, old.bundles.get(p), new.bundles.get(p)) for p in paths))


def regressions(diff: Diff, pct: float) -> list[Regression]:
    """Entries on both sides that got slower, or lost speedup vs the baseline, by more than pct %."""
    found: list[Regression] = []
    for path, e in diff.entries("changed") + diff.entries("unchanged"):
        assert e.old is not None and e.new is not None
        slower = e.tuned_ms_pct
        if slower is not None and slower > pct:
            found.append(Regression(path, e.key, "tuned_ms", e.old.timing.tuned_ms, e.new.timing.tuned_ms, slower))
        lost = e.vs_baseline_loss_pct
        if lost is not None and lost > pct:
            assert e.old.speedup.vs_baseline is not None and e.new.speedup.vs_baseline is not None
            found.append(Regression(path, e.key, "vs_baseline", e.old.speedup.vs_baseline,
                                    e.new.speedup.vs_baseline, lost))
    return sorted(found, key=lambda r: (r.path, r.key, r.metric))


# --- formatting helpers -----------------------------------------------------------------


def _value(v: Any) -> str:
    if v is None:
        return "(absent)"
    if isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v):
        return v[:12]  # a sha256: the prefix is enough to tell them apart in a review
    if isinstance(v, (list, dict)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def _entry_cell(e: EntryDiff) -> str:
    """The entry's key, and whether the new side's config was adopted from a sibling SKU's entry."""
    note = adopted_note(e.new.search.adopted_from) if e.new is not None else ""
    return e.key + (f"\n{note}" if note else "")


def _ms(e: Entry | None) -> str:
    return "-" if e is None else f"{e.timing.tuned_ms:.4f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _tuned_cell(e: EntryDiff) -> str:
    if e.old is None or e.new is None:
        return _ms(e.new or e.old)
    if e.cards is not None:
        return f"{_ms(e.old)} ({e.cards[0]}) -> {_ms(e.new)} ({e.cards[1]})"
    pct = e.tuned_ms_pct
    assert pct is not None
    return f"{_ms(e.old)} -> {_ms(e.new)} ({pct:+.1f}%)"


def _speedup_cell(e: EntryDiff, which: Literal["vs_default", "vs_baseline"]) -> str:
    if e.old is None or e.new is None:
        side = e.new or e.old
        assert side is not None
        return _x(getattr(side.speedup, which))
    a, b = getattr(e.old.speedup, which), getattr(e.new.speedup, which)
    if a is None and b is None:
        return "-"
    if a is None or b is None:
        return f"{_x(a)} -> {_x(b)}"
    return f"{a:.2f}x -> {b:.2f}x ({b - a:+.2f})"


_FAILURE_CHANGE = {"added": "new failure", "removed": "fixed", "changed": "reason changed"}


def _reason(f: FailureDiff) -> str:
    """The current reason; for a fixed failure, the reason it had."""
    side = f.new if f.new is not None else f.old
    return side.reason if side is not None else ""


def _config_lines(e: EntryDiff) -> list[str]:
    return [f"{c.field}: {_value(c.old)} -> {_value(c.new)}" for c in e.config]


def summary_line(diff: Diff, regs: list[Regression] | None, pct: float | None) -> str:
    s = diff.summary()
    if not diff.has_changes:
        text = f"no changes ({s['entries_unchanged']} entries in {s['bundles_compared']} bundle(s) compared)"
    else:
        bundles = f"{s['bundles_changed']} bundle(s) changed"
        if s["bundles_added"] or s["bundles_removed"]:
            bundles += f" ({s['bundles_added']} new, {s['bundles_removed']} removed)"
        same_card = s["entries_changed"] - sum(e.cards is not None for _, e in diff.entries("changed"))
        timed = f"; {s['faster']} faster, {s['slower']} slower" if same_card or not s["other_card"] else ""
        text = (f"{bundles}; entries +{s['entries_added']} -{s['entries_removed']} ~{s['entries_changed']} "
                f"({s['configs_changed']} config(s) changed{timed}); "
                f"failures +{s['failures_added']} -{s['failures_removed']}"
                + (f" ~{s['failures_changed']}" if s["failures_changed"] else "")
                + (f"; {s['provenance_changes']} provenance change(s)" if s["provenance_changes"] else ""))
        if s["other_card"]:
            pairs = sorted({e.cards for _, e in diff.entries("changed") + diff.entries("unchanged") if e.cards})
            text += (f"; {s['other_card']} entries timed on different cards ("
                     + ", ".join(f"{a} -> {b}" for a, b in pairs)
                     + "): their times are not compared, `mamba-tune verify NEW --against OLD` on one card does")
    if regs is not None and pct is not None:
        text += f"; {len(regs)} regression(s) over {pct:g}%" if regs else f"; no regression over {pct:g}%"
    return text


# --- JSON -------------------------------------------------------------------------------


def _timing_json(e: Entry | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return {"tuned_ms": e.timing.tuned_ms, "default_ms": e.timing.default_ms, "baseline_ms": e.timing.baseline_ms,
            "baseline": e.timing.baseline, "vs_default": e.speedup.vs_default, "vs_baseline": e.speedup.vs_baseline,
            "config": e.config, "adopted_from": e.search.adopted_from}


def to_json(diff: Diff, regs: list[Regression] | None = None, pct: float | None = None) -> dict[str, Any]:
    """Machine-readable diff; unchanged entries are counted in the summary, not listed."""

    def change(c: Change) -> dict[str, Any]:
        return {"field": c.field, "old": c.old, "new": c.new}

    return {
        "old": diff.old_label,
        "new": diff.new_label,
        "summary": diff.summary(),
        "regression_threshold_pct": pct,
        "regressions": None if regs is None else [dataclasses.asdict(r) for r in regs],
        "bundles": [{
            "path": b.path,
            "status": b.status,
            "provenance": [change(c) for c in b.provenance],
            "entries": [{
                "key": e.key, "kind": e.kind, "parts": list(e.parts), "config": [change(c) for c in e.config],
                "tuned_ms_pct": e.tuned_ms_pct, "cards": list(e.cards) if e.cards else None, "vs_default_delta": e.vs_default_delta,
                "vs_baseline_delta": e.vs_baseline_delta, "old": _timing_json(e.old), "new": _timing_json(e.new),
            } for e in b.entries if e.kind != "unchanged"],
            "failures": [{"key": f.key, "kind": f.kind, "old_reason": f.old.reason if f.old else None,
                          "new_reason": f.new.reason if f.new else None} for f in b.failures],
        } for b in diff.bundles],
    }


# --- markdown ---------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def _md_code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


def _md_table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _adopted_md(e: EntryDiff) -> str:
    note = adopted_note(e.new.search.adopted_from) if e.new is not None else ""
    return f"<br>{note}" if note else ""


def to_markdown(diff: Diff, regs: list[Regression] | None = None, pct: float | None = None) -> str:
    """A PR comment: one summary line, then a section per changed bundle."""
    lines = [f"**mamba-tune diff** {_md_code(diff.old_label)} -> {_md_code(diff.new_label)}: "
             f"{summary_line(diff, regs, pct)}", ""]
    if regs:
        lines += [f"### Regressions (over {pct:g}%)", ""]
        lines += _md_table(["bundle", "entry", "what"],
                           ([_md_code(r.path), _md_code(r.key), r.describe()] for r in regs))
    for b in diff.bundles:
        if not b.has_changes:
            continue
        note = {"added": " (new bundle)", "removed": " (bundle removed)", "both": ""}[b.status]
        lines += [f"### {_md_code(b.path)}{note}", ""]
        if b.provenance:
            lines += ["**Provenance**", ""]
            lines += _md_table(["field", "old", "new"],
                               ([c.field, _md_code(_value(c.old)), _md_code(_value(c.new))] for c in b.provenance))
        added, removed, changed = b.of_kind("added"), b.of_kind("removed"), b.of_kind("changed")
        if added:
            lines += [f"**Added** ({len(added)})", ""]
            lines += _md_table(["entry", "tuned ms", "vs default", "vs baseline"],
                               ([_md_code(e.key) + _adopted_md(e), _ms(e.new), _speedup_cell(e, "vs_default"),
                                 _speedup_cell(e, "vs_baseline")] for e in added))
        if removed:
            lines += [f"**Removed** ({len(removed)})", ""]
            lines += _md_table(["entry", "tuned ms", "vs default", "vs baseline"],
                               ([_md_code(e.key), _ms(e.old), _speedup_cell(e, "vs_default"),
                                 _speedup_cell(e, "vs_baseline")] for e in removed))
        if changed:
            lines += [f"**Changed** ({len(changed)})", ""]
            lines += _md_table(["entry", "config", "tuned ms", "vs default", "vs baseline"],
                               ([_md_code(e.key) + _adopted_md(e),
                                 "<br>".join(_md_code(x) for x in _config_lines(e)) or "(same config)",
                                 _tuned_cell(e), _speedup_cell(e, "vs_default"), _speedup_cell(e, "vs_baseline")]
                                for e in changed))
        if b.failures:
            lines += [f"**Failures** ({len(b.failures)})", ""]
            lines += _md_table(["entry", "change", "reason"],
                               ([_md_code(f.key), _FAILURE_CHANGE[f.kind], _reason(f)] for f in b.failures))
    return "\n".join(lines).rstrip() + "\n"


def _add_row(table: Table, *cells: str | Text) -> None:
    """Cells are plain text: a '[...]' in a config value or an error is not rich markup."""
    table.add_row(*(c if isinstance(c, Text) else Text(c) for c in cells))


# --- rich table -------------------------------------------------------------------------


def to_rich(diff: Diff, regs: list[Regression] | None = None, pct: float | None = None) -> RenderableType:
    parts: list[RenderableType] = [Text(f"{diff.old_label} -> {diff.new_label}: {summary_line(diff, regs, pct)}")]
    if regs:
        t = Table(title=f"regressions over {pct:g}%", title_style="bold red")
        for col in ("bundle", "entry", "what"):
            t.add_column(col, overflow="fold")
        for r in regs:
            _add_row(t, r.path, r.key, r.describe())
        parts.append(t)
    for b in diff.bundles:
        if not b.has_changes:
            continue
        note = {"added": " (new bundle)", "removed": " (bundle removed)", "both": ""}[b.status]
        if b.provenance:
            t = Table(title=f"{escape(b.path)}: provenance")
            for col in ("field", "old", "new"):
                t.add_column(col, overflow="fold")
            for c in b.provenance:
                _add_row(t, c.field, _value(c.old), _value(c.new))
            parts.append(t)
        rows = [e for e in b.entries if e.kind != "unchanged"]
        if rows:
            t = Table(title=f"{escape(b.path + note)}: entries")
            for col in ("change", "entry", "config", "tuned ms", "vs default", "vs baseline"):
                t.add_column(col, overflow="fold")
            style = {"added": "green", "removed": "red", "changed": "yellow"}
            for e in rows:
                _add_row(t, Text(e.kind, style=style[e.kind]), _entry_cell(e), "\n".join(_config_lines(e)) or
                          ("" if e.kind != "changed" else "(same config)"), _tuned_cell(e),
                          _speedup_cell(e, "vs_default"), _speedup_cell(e, "vs_baseline"))
            parts.append(t)
        if b.failures:
            t = Table(title=f"{escape(b.path)}: failures")
            for col in ("change", "entry", "reason"):
                t.add_column(col, overflow="fold")
            for f in b.failures:
                _add_row(t, _FAILURE_CHANGE[f.kind], f.key, _reason(f))
            parts.append(t)
    return Group(*parts)
