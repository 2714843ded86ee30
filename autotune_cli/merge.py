"""Merge bundles tuned in separate runs (other clusters, other days) into one.

The same key in several bundles keeps the fastest entry (timing.tuned_ms). Timings are only
comparable on one GPU model with one set of versions, so bundles of different GPUs or
versions are refused unless the caller allows mixing (then the first bundle's provenance
is kept and the others' entries are taken as they are).

A kernel's entries are only valid for the kernel source they were tuned with (the bundle's
per-kernel provenance). Where the bundles name different sources for one kernel, the merged
bundle keeps that kernel's record and entries from the bundles tuned with the source in this
checkout (else from the most recently updated bundle), and drops its other entries with a
note: an entry tuned on an older source, labelled with the newer one, would pass for fresh.
"""

from __future__ import annotations

from pathlib import Path

from autotune_cli import environment as env
from mamba_tune.bundle import Bundle, BundleError, Entry, KernelProvenance, load_bundle
from mamba_tune.keys import all_keys


class MergeError(Exception):
    """Bundles that must not be merged: exit code 2."""


def _identity(b: Bundle) -> tuple[str, str, str, str, str]:
    g, v = b.provenance.gpu, b.provenance.versions
    return g.name, g.compute_capability, v.helion, v.torch, v.triton


def _current_sources() -> dict[str, str]:
    """Each kernel's source hash in this checkout."""
    return {k.name: k.source_sha256() for k in all_keys().values()}


def _kernel_records(bundles: list[tuple[Path, Bundle]]) -> dict[str, KernelProvenance]:
    """The record each kernel keeps: the one tuned with this checkout's source where a bundle
    has it, else the most recently updated bundle's."""
    current = _current_sources()
    chosen: dict[str, tuple[tuple[bool, str], KernelProvenance]] = {}
    for _, b in bundles:
        for name, kp in b.provenance.kernels.items():
            rank = (kp.source_sha256 == current.get(name), b.provenance.updated)
            if name not in chosen or rank > chosen[name][0]:
                chosen[name] = (rank, kp)
    return {name: kp for name, (_, kp) in chosen.items()}


def merge_bundles(paths: list[Path], *, allow_mixed: bool = False) -> tuple[Bundle, list[str]]:
    """The merged bundle and one line per key found in several bundles (which entry won)."""
    if not paths:
        raise MergeError("no bundles to merge")
    bundles: list[tuple[Path, Bundle]] = []
    for p in paths:
        try:
            bundles.append((p, load_bundle(p)))
        except BundleError as e:
            raise MergeError(str(e)) from None
    first_path, first = bundles[0]
    if not allow_mixed:
        for p, b in bundles[1:]:
            if _identity(b) != _identity(first):
                g, cc, h, t, tr = _identity(b)
                g0, cc0, h0, t0, tr0 = _identity(first)
                raise MergeError(
                    f"{p} was tuned on {g} (sm {cc}) with helion {h}, torch {t}, triton {tr}; {first_path} on "
                    f"{g0} (sm {cc0}) with helion {h0}, torch {t0}, triton {tr0}: timings do not compare "
                    "(pass --allow-mixed to merge anyway)")
    kernels = _kernel_records(bundles)
    entries: dict[str, Entry] = {}
    failures = dict(first.failures)
    source: dict[str, Path] = {}
    notes: list[str] = []
    for p, b in bundles:
        for key, e in b.entries.items():
            kp = b.provenance.kernels.get(e.kernel)
            if kp is not None and kernels.get(e.kernel) != kp:
                notes.append(f"{key}: dropped from {p} (tuned with another source of {e.kernel}: "
                             f"{kp.source_sha256[:12]} != {kernels[e.kernel].source_sha256[:12]})")
                continue
            old = entries.get(key)
            if old is None:
                entries[key] = e
                source[key] = p
                continue
            if e.timing.tuned_ms < old.timing.tuned_ms:
                notes.append(f"{key}: {p} ({e.timing.tuned_ms:.4f} ms) over {source[key]} "
                             f"({old.timing.tuned_ms:.4f} ms)")
                entries[key] = e
                source[key] = p
            else:
                notes.append(f"{key}: {source[key]} ({old.timing.tuned_ms:.4f} ms) over {p} "
                             f"({e.timing.tuned_ms:.4f} ms)")
        for key, f in b.failures.items():
            failures.setdefault(key, f)
    failures = {k: f for k, f in failures.items() if k not in entries}
    created = min(b.provenance.created for _, b in bundles)
    prov = first.provenance.model_copy(update={"created": created, "updated": env.now(), "kernels": kernels})
    merged = Bundle(provenance=prov, entries=dict(sorted(entries.items())), failures=dict(sorted(failures.items())))
    return merged, notes
