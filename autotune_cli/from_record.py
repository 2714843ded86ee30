"""A call record (mamba_tune.record) -> the combos `mamba-tune sweep --from-record` tunes.

A recorded key becomes a `Combo` when a call of it was served by anything but an exact
entry of the GPU's own SKU (``nearest ...``, ``default``, or an entry tuned on a sibling
SKU: ``exact (tuned on h200, running on h100)``), or always with ``force``. Every recorded kernel,
its dims and dtype are checked against the known kernels first, so a stale or foreign
record is one line (`RecordError`) before anything is tuned.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune_cli.plan import Combo
from autotune_cli.tuning import all_kernels
from mamba_tune.record import RecordError, load_record
from mamba_tune.sku import sku_of
from mamba_tune.vocab import DTYPES


@dataclasses.dataclass(frozen=True)
class RecordPlan:
    combos: list[Combo]  # what to tune, most-called first
    recorded: int  # keys in the record
    exact: int  # keys every call of which had an exact entry
    skus: list[str]  # GPU SKUs the calls ran on (empty: CPU only)


def combos_from_record(path: str | Path, *, force: bool = False) -> RecordPlan:
    """The combos of a record that lack an exact entry (all of them with `force`)."""
    doc = load_record(path)
    known = all_kernels()
    combos: list[tuple[int, Combo]] = []
    exact = 0
    for key, rec in doc["calls"].items():
        where = f"{path}: calls[{key!r}]"
        kernel, dims, dtype = rec["kernel"], rec["dims"], rec["dtype"]
        tk = known.get(kernel)
        if tk is None:
            raise RecordError(f"{where}: unknown kernel {kernel!r}; known: {', '.join(known)}")
        if set(dims) != set(tk.dims):
            raise RecordError(f"{where}: {kernel} has dims {', '.join(tk.dims)}, the record has "
                              f"{', '.join(sorted(dims))}")
        negative = [f"{d}={v}" for d, v in dims.items() if v < 0]
        if negative:
            raise RecordError(f"{where}: negative dims {', '.join(negative)}")
        if dtype not in DTYPES:
            raise RecordError(f"{where}: unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
        served = rec["served"]
        if set(served) == {"exact"}:
            exact += 1
            if not force:
                continue
        how = ", ".join(f"{s} {n}" for s, n in sorted(served.items()))
        origin = f"recorded: {rec['calls']} calls ({how})"
        combos.append((rec["calls"], Combo(kernel=kernel, dims={d: dims[d] for d in tk.dims}, dtype=dtype,
                                           origins=(origin,))))
    combos.sort(key=lambda nc: (-nc[0], nc[1].key))
    skus = sorted({sku_of(d) for d in doc["devices"] if d not in ("cpu", "none")})
    return RecordPlan(combos=[c for _, c in combos], recorded=len(doc["calls"]), exact=exact, skus=skus)
