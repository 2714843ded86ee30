"""The coverage gate: does every combo of a spec have a fresh tuned entry for its GPU?

A combo of `plan(spec)` is covered when some bundle under `DIR/<target sku>/` has an
entry with its key and that bundle

- was tuned on the spec's target SKU and arch (provenance.gpu),
- records, for the entry's kernel, the source hash of the kernel as it is in this
  checkout (provenance.kernels[kernel].source_sha256 == KernelKey.source_sha256()),
- was tuned with the expected helion, torch and triton versions,
- holds a config that Helion accepts for the kernel at the entry's dims (checked on the
  CPU, `autotune_cli.lowering.config_problem`; only this part imports torch and helion,
  and only when a bundle entry is checked).

The version rule (CI runs this on a CPU box, which cannot see the GPU machine's stack):
the expected version of each package is the one given as an option (--helion-version
...), else the one recorded in the newest bundle of the set (largest provenance.updated).
So a set passes when all its bundles share one stack, and a bundle left behind on an
older stack is stale. A version matches when equal, or, if the expected version has no
local label, when the recorded one equals it up to its local label ('2.11.0' matches
'2.11.0+cu130', '2.11.0+cu130' matches only itself).

Missing: no bundle has the key (a recorded failure is named). Stale: an entry exists but
every bundle holding it fails one of the rules above; the reasons say which. Sibling: no
bundle of the target SKU has the key, but a bundle under `DIR/<sibling sku>/` (another SKU
of the same arch, e.g. h200 for an h100 spec) has an entry the runtime would fall back to
(tuned on that SKU, kernel source unchanged): not tuned for this SKU, so not covered, but
the reasons name the entry that runs instead (docs/bundles.md).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any, Literal

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from autotune_cli.plan import plan
from autotune_cli.spec import Spec
from mamba_tune.bundle import Bundle, Entry, find_bundles, load_bundle
from mamba_tune.keys import all_keys
from mamba_tune.sku import GPU_SKUS, siblings

PACKAGES = ("helion", "torch", "triton")


@dataclasses.dataclass(frozen=True)
class Expected:
    """The expected version of each package and where it came from."""

    versions: dict[str, str | None]  # None: nothing to compare against (no bundles, no option)
    sources: dict[str, str]  # "option" | "newest bundle <path>"


@dataclasses.dataclass(frozen=True)
class ComboStatus:
    key: str
    status: Literal["ok", "missing", "stale", "sibling"]
    bundle: str | None  # the bundle that covers it (ok)
    reasons: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CheckResult:
    spec: str
    sku: str
    folder: str
    bundles: tuple[str, ...]
    expected: Expected
    combos: tuple[ComboStatus, ...]

    @property
    def ok(self) -> bool:
        return all(c.status == "ok" for c in self.combos)

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.combos)


def version_matches(recorded: str, expected: str) -> bool:
    if recorded == expected:
        return True
    return "+" not in expected and recorded.split("+", 1)[0] == expected


def _updated(b: Bundle) -> dt.datetime:
    try:
        t = dt.datetime.fromisoformat(b.provenance.updated)
    except ValueError:
        return dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def expected_versions(bundles: dict[str, Bundle], given: dict[str, str | None]) -> Expected:
    newest = max(bundles.items(), key=lambda kv: (_updated(kv[1]), kv[0]), default=None)
    versions: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    for pkg in PACKAGES:
        if given.get(pkg):
            versions[pkg], sources[pkg] = given[pkg], "option"
        elif newest is not None:
            versions[pkg] = getattr(newest[1].provenance.versions, pkg)
            sources[pkg] = f"newest bundle {newest[0]}"
        else:
            versions[pkg], sources[pkg] = None, "no bundles"
    return Expected(versions, sources)


def _bundle_problems(bundle: Bundle, sku: str, expected: Expected) -> list[str]:
    """Reasons that make every entry of the bundle stale, whatever its kernel."""
    problems: list[str] = []
    want = GPU_SKUS[sku]
    gpu = bundle.provenance.gpu
    if (gpu.sku, gpu.arch) != (want.sku, want.arch):
        problems.append(f"tuned on {gpu.name} ({gpu.sku}, {gpu.arch}), not {want.sku} ({want.arch})")
    for pkg in PACKAGES:
        exp = expected.versions[pkg]
        rec = getattr(bundle.provenance.versions, pkg)
        if exp is not None and not version_matches(rec, exp):
            problems.append(f"{pkg} {rec} != expected {exp} ({expected.sources[pkg]})")
    return problems


def _config_problem(entry: Entry) -> str | None:
    """Why Helion rejects the entry's config at its dims (None: accepted); see `autotune_cli.lowering`."""
    from autotune_cli.lowering import config_problem  # imports torch and helion
    from autotune_cli.tuning import all_kernels

    return config_problem(all_kernels()[entry.kernel], entry)


def _sibling_bundles(root: Path, sku: str) -> dict[str, Bundle]:
    """The bundles under root/<sibling>/ tuned on that sibling SKU: what the runtime falls back to."""
    out: dict[str, Bundle] = {}
    for sibling in siblings(sku):
        folder = root / sibling
        for p in find_bundles([folder]) if folder.is_dir() else []:
            b = load_bundle(p)
            if (b.provenance.gpu.sku, b.provenance.gpu.arch) == (sibling, GPU_SKUS[sku].arch):
                out[p.as_posix()] = b
    return out


def _source_of(b: Bundle, kernel: str) -> str | None:
    prov = b.provenance.kernels.get(kernel)
    return None if prov is None else prov.source_sha256


def check_coverage(spec: Spec, root: Path, given: dict[str, str | None] | None = None) -> CheckResult:
    """Coverage of `spec` by the bundles under `root/<target sku>/` (BundleError on a bad bundle)."""
    sku = spec.target.gpu
    folder = root / sku
    paths = find_bundles([folder]) if folder.is_dir() else []
    bundles = {p.as_posix(): load_bundle(p) for p in paths}
    expected = expected_versions(bundles, given or {})
    hashes = {name: key.source_sha256() for name, key in all_keys().items()}
    problems = {path: _bundle_problems(b, sku, expected) for path, b in bundles.items()}
    fallbacks = _sibling_bundles(root, sku)

    combos: list[ComboStatus] = []
    for combo in plan(spec):
        stale: list[str] = []
        covered_by: str | None = None
        for path, b in bundles.items():
            if combo.key not in b.entries:
                continue
            why = list(problems[path])
            prov = b.provenance.kernels.get(combo.kernel)
            if prov is None:
                why.append(f"no source hash recorded for kernel {combo.kernel}")
            elif prov.source_sha256 != hashes[combo.kernel]:
                why.append(f"kernel {combo.kernel} changed since tuning (source {prov.source_sha256[:12]} "
                           f"!= current {hashes[combo.kernel][:12]})")
            if not why:
                rejected = _config_problem(b.entries[combo.key])
                if rejected is not None:
                    why.append(f"Helion rejects its config: {rejected}")
            if not why:
                covered_by = path
                break
            stale.append(f"{path}: " + "; ".join(why))
        if covered_by is not None:
            combos.append(ComboStatus(combo.key, "ok", covered_by, ()))
        elif stale:
            combos.append(ComboStatus(combo.key, "stale", None, tuple(stale)))
        else:
            failed = [f"{path}: tuning failed: {b.failures[combo.key].reason}"
                      for path, b in bundles.items() if combo.key in b.failures]
            fallback = next((f"not tuned for {sku}: {path} has its entry, tuned on {b.provenance.gpu.sku} (what the "
                             f"runtime falls back to where no {sku} entry is near enough)"
                             for path, b in fallbacks.items() if combo.key in b.entries
                             and _source_of(b, combo.kernel) == hashes[combo.kernel]), None)
            if fallback is not None:
                combos.append(ComboStatus(combo.key, "sibling", None, (fallback, *failed)))
            else:
                combos.append(ComboStatus(combo.key, "missing", None,
                                          tuple(failed) or (f"no entry in any bundle under {folder}",)))
    return CheckResult(spec.name, sku, folder.as_posix(), tuple(bundles), expected, tuple(combos))


# --- renderings -------------------------------------------------------------------------


def summary_line(r: CheckResult) -> str:
    n = len(r.combos)
    head = f"check {r.spec} ({r.sku}): {r.count('ok')}/{n} combos covered by {len(r.bundles)} bundle(s) in {r.folder}"
    if not r.ok:
        head += f"; {r.count('missing')} missing, {r.count('stale')} stale"
        if r.count("sibling"):
            head += f", {r.count('sibling')} served by a sibling SKU's entries (not tuned for {r.sku})"
    exp = ", ".join(f"{pkg} {r.expected.versions[pkg] or '-'}" for pkg in PACKAGES)
    return f"{head}. Expected {exp}"


def _sources_line(r: CheckResult) -> str:
    return "versions from: " + ", ".join(f"{pkg}: {r.expected.sources[pkg]}" for pkg in PACKAGES)


def to_json(r: CheckResult) -> dict[str, Any]:
    return {
        "spec": r.spec, "sku": r.sku, "folder": r.folder, "ok": r.ok, "bundles": list(r.bundles),
        "expected_versions": r.expected.versions, "expected_sources": r.expected.sources,
        "counts": {s: r.count(s) for s in ("ok", "missing", "stale", "sibling")},
        "combos": [dataclasses.asdict(c) | {"reasons": list(c.reasons)} for c in r.combos],
    }


def dumps_json(r: CheckResult) -> str:
    return json.dumps(to_json(r), indent=2, allow_nan=False) + "\n"


def to_markdown(r: CheckResult) -> str:
    lines = [f"**mamba-tune {summary_line(r)}**", "", _sources_line(r), ""]
    bad = [c for c in r.combos if c.status != "ok"]
    if bad:
        lines += ["| status | combo | why |", "|---|---|---|"]
        for c in bad:
            why = "<br>".join(line.replace("|", "\\|") for x in c.reasons for line in x.splitlines())
            # GFM splits table cells at '|' even inside code spans: escape the key's pipes.
            key = c.key.replace("|", "\\|")
            lines.append(f"| {c.status} | `{key}` | {why} |")
        lines.append("")
    return "\n".join(lines)


def _add_row(table: Table, *cells: str | Text) -> None:
    """Cells are plain text: a '[...]' in a config value or an error is not rich markup."""
    table.add_row(*(c if isinstance(c, Text) else Text(c) for c in cells))


def to_rich(r: CheckResult) -> RenderableType:
    parts: list[RenderableType] = [Text(summary_line(r), style="green" if r.ok else "red"), Text(_sources_line(r))]
    bad = [c for c in r.combos if c.status != "ok"]
    if bad:
        t = Table(title=f"{len(bad)} combo(s) not covered")
        for col in ("status", "combo", "why"):
            t.add_column(col, overflow="fold")
        for c in bad:
            _add_row(t, Text(c.status, style="red" if c.status == "missing" else "yellow"), c.key, "\n".join(c.reasons))
        parts.append(t)
    return Group(*parts)
