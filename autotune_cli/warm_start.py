"""Warm start: where a search starts, from the entries already tuned.

A combo's search starts from (in this order, duplicates dropped, at most `WARM_LIMIT`):
1. the config its own key has in the bundle being written (a re-tune starts from what it
   has) or, failing that, in a `--warm-start` bundle;
2. the configs of the nearest tuned shapes of the same kernel and dtype with the same
   structural dims (every key dim not in the kernel's size dims), nearest first by the
   distance of the runtime's nearest rule (the sum of |log(a/b)| over the size dims; ties to
   the smaller shape), with no cap on the ratio: a seed is only a starting point, and the
   search measures it like any other candidate. Entries that differ in structural dims the
   kernel declares config-neutral (`TunableKernel.seed_across`: the gated norm's weight_fp32,
   whose config space is the same for both weight dtypes) join at the same distance, after
   the same-structure ones. Why: the H200 tune of the bf16-weight norm backward at Nano TP1
   (25 s) ended on its default config at 0.299 ms (53% of the copy bandwidth), while the
   fp32-weight entry of the same rows and width runs at 0.195 ms (81%), and no search had
   started from that config (how fast it runs with a bf16 weight is not measured yet).
Then come the kernel's own hand-written seeds (`TunableKernel.seed_configs`). Helion skips,
with a log line, a seed that does not fit the shape; the tuner drops one that does not fit the
kernel (an entry tuned on an earlier version of it: `autotune_cli.tuner.fitting_seeds`).

Only entries tuned on this SKU, or (--warm-start) on a sibling SKU of the same arch, count: a
sibling's winner is a starting point the search times here like any candidate (the first H100
tune starts from the H200's); a config tuned on another arch is no evidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mamba_tune.bundle import Bundle

if TYPE_CHECKING:
    from autotune_cli.tuning import TunableKernel

# Starting points taken from bundles per combo (the exact key's, then the nearest shapes').
WARM_LIMIT = 3


def warm_configs(size_dims: Sequence[str], kernel: str, dims: dict[str, int], dtype: str,
                 bundles: Sequence[Bundle], *, limit: int = WARM_LIMIT,
                 across: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The configs a search for (kernel, dims, dtype) starts from; see the module docstring.
    across: structural dims that may differ (the kernel's `seed_across`)."""
    exact: list[dict[str, Any]] = []
    near: list[tuple[float, bool, tuple[int, ...], dict[str, Any]]] = []
    for bundle in bundles:
        for entry in bundle.entries.values():
            if entry.kernel != kernel or entry.dtype != dtype or entry.dims.keys() != dims.keys():
                continue
            differ = {d for d in dims if d not in size_dims and entry.dims[d] != dims[d]}
            if not differ <= set(across):
                continue
            if entry.dims == dims:
                exact.append(dict(entry.config))
                continue
            if any(entry.dims[d] <= 0 or dims[d] <= 0 for d in size_dims):
                continue
            dist = sum(abs(math.log(entry.dims[d] / dims[d])) for d in size_dims)
            near.append((dist, bool(differ), tuple(entry.dims[d] for d in size_dims), dict(entry.config)))
    near.sort(key=lambda t: t[:3])
    out: list[dict[str, Any]] = []
    for config in [*exact[:1], *(c for *_, c in near)]:
        if config not in out:
            out.append(config)
        if len(out) == limit:
            break
    return out


def seed_configs(tk: TunableKernel, dims: dict[str, int], warm_start: Sequence[dict[str, Any]] | None) -> list[Any]:
    """The search's hand-picked starting points: the warm start (the config already in the
    bundle for this key, then the nearest tuned shapes': `warm_configs`), then the kernel's
    own seeds for these dims; duplicates dropped. (Here, not in the tuner: `lowering` checks
    the seeds and the tuner asks `lowering` for config spaces.)"""
    import helion

    raw = [*(warm_start or []), *(tk.seed_configs(dims) if tk.seed_configs else [])]
    unique = [c for i, c in enumerate(raw) if c not in raw[:i]]
    return [helion.Config.from_dict(c) for c in unique]
