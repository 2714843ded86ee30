"""Merge bundles tuned in separate runs (other clusters, other days) into one.

The same key in several bundles keeps the fastest entry (timing.tuned_ms). Timings are only
comparable on one GPU model with one set of versions, so bundles of different GPUs or
versions are refused unless the caller allows mixing (then the first bundle's provenance
is kept and the others' entries are taken as they are).
"""

from __future__ import annotations

from pathlib import Path

from autotune_cli import environment as env
from mamba_tune.bundle import Bundle, BundleError, load_bundle


class MergeError(Exception):
    """Bundles that must not be merged: exit code 2."""


def _identity(b: Bundle) -> tuple[str, str, str, str, str]:
    g, v = b.provenance.gpu, b.provenance.versions
    return g.name, g.compute_capability, v.helion, v.torch, v.triton


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
    entries = dict(first.entries)
    failures = dict(first.failures)
    kernels = dict(first.provenance.kernels)
    source = {k: first_path for k in entries}
    notes: list[str] = []
    for p, b in bundles[1:]:
        for name, kp in b.provenance.kernels.items():
            kernels.setdefault(name, kp)
        for key, e in b.entries.items():
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
