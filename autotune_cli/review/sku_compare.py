"""What tuning on a SKU buys over borrowing a sibling SKU's entries: `verify BUNDLE --against OTHER`.

`mamba-tune verify generated_configs/h100/nemotron-nano.json --against
generated_configs/h200/nemotron-nano.json` times, on an H100 and in one process, each H100
entry's config, the H200 entry's config for the same key (what an H100 runs when it borrows
the sibling's bundle: docs/bundles.md), the kernel's default config and mamba-ssm
(`review.verify`). This module holds the rule for which bundle may be compared (a sibling
SKU of the same arch, `mamba_tune.sku.siblings`) and the summary per kernel that `verify`
prints and `mamba-tune results` puts in docs/results.md. Torch-free: it reads verify's
JSON rows (`EntryResult.to_json`).

Ratios are speedups, as everywhere in the project: the other side's time over ours, so
above 1.00x this SKU's own entry is faster.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from mamba_tune.bundle import GpuInfo
from mamba_tune.sku import siblings


def against_problem(ours: GpuInfo, other: GpuInfo) -> str | None:
    """Why a bundle tuned on `other` is no sibling to compare a bundle tuned on `ours` with, or None."""
    near = siblings(ours.sku)
    if other.sku in near:
        return None
    if other.sku == ours.sku:
        why = f"tuned on {other.sku}, as the bundle verified is (two bundles of one SKU: `mamba-tune diff`)"
    else:
        why = f"tuned on {other.sku} ({other.arch}), the bundle verified on {ours.sku} ({ours.arch})"
    return f"{why}; --against takes a bundle of a sibling SKU of the same arch ({', '.join(near) or 'none known'})"


def geomean(values: Iterable[float]) -> float | None:
    vs = list(values)
    return math.exp(sum(math.log(v) for v in vs) / len(vs)) if vs else None


@dataclasses.dataclass(frozen=True)
class KernelSummary:
    """One kernel's entries (or all: kernel "all"): speedups of this SKU's entries, geomeans."""

    kernel: str
    entries: int  # this bundle's entries (verified)
    compared: int  # of which the sibling's entry for the same key was timed too
    same_config: int  # of those, the sibling's config is this SKU's
    other_failed: int  # the sibling's entry did not compile or failed the numerics here
    vs_other: float | None  # geomean over `compared`
    vs_other_min: float | None
    vs_other_max: float | None
    vs_default: float | None  # geomean over the entries timed
    vs_baseline: float | None  # geomean over the entries with a baseline (mamba-ssm) time


def _summary(kernel: str, rows: list[Mapping[str, Any]]) -> KernelSummary:
    other = [r["vs_other"] for r in rows if r.get("vs_other") is not None]
    return KernelSummary(
        kernel=kernel, entries=len(rows), compared=len(other),
        same_config=sum(1 for r in rows if r.get("vs_other") is not None and r.get("same_as_other")),
        other_failed=sum(1 for r in rows if r.get("other_reasons")),
        vs_other=geomean(other), vs_other_min=min(other, default=None), vs_other_max=max(other, default=None),
        vs_default=geomean(r["vs_default"] for r in rows if r.get("vs_default") is not None),
        vs_baseline=geomean(r["vs_baseline"] for r in rows if r.get("vs_baseline") is not None))


def summarize(rows: list[Mapping[str, Any]]) -> list[KernelSummary]:
    """Per kernel (by name), then "all", from verify's JSON rows (`EntryResult.to_json`)."""
    kernels = sorted({r["kernel"] for r in rows})
    out = [_summary(k, [r for r in rows if r["kernel"] == k]) for k in kernels]
    return [*out, _summary("all", list(rows))] if len(kernels) > 1 else out


HEADER = ("kernel", "entries", "compared", "same config", "sibling failed", "vs sibling (geomean)", "min", "max",
          "vs default", "vs mamba-ssm")


def cells(s: KernelSummary) -> list[str]:
    """One summary's cells under HEADER, for the terminal table and the markdown alike."""
    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}x"

    return [s.kernel, str(s.entries), str(s.compared), str(s.same_config), str(s.other_failed), x(s.vs_other),
            x(s.vs_other_min), x(s.vs_other_max), x(s.vs_default), x(s.vs_baseline)]


def markdown(card: str, other: str, bundle: str, summaries: list[KernelSummary]) -> list[str]:
    """A markdown table of one comparison: this card's bundle against the sibling's entries."""
    head = ("card", "bundle", "against", *HEADER)
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for s in summaries:
        c = cells(s)
        if s.kernel == "all":
            c = [f"**{v}**" for v in c]
        lines.append(f"| {card.upper()} | {bundle} | {other} entries | " + " | ".join(c) + " |")
    return lines
