"""Spec -> the exact, de-duplicated list of (kernel, dims, dtype) combos to tune."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection

from autotune_cli.spec import Budget, Spec
from mamba_tune.bundle import entry_key
from mamba_tune.keys import KernelKey, ModelShape, all_keys

# Rough wall time of one combo's search by Helion effort (seconds), measured on the H200
# with Helion 1.5.0 (the H200 notes: quick = 1.5-4.5 minutes per kernel x
# shape; full = 1-2 hours); plus the rest of a combo: the worker's start, set-up, the fp32 check,
# timing the winner and mamba-ssm's kernels (their first-call autotune). That rest took 20-56 s,
# 34 s on average, over ten SSD backward combos on the H200 (30 s searches, which
# themselves ran 32-56 s: the first configs' compiles finish past the cap).
EFFORT_SECONDS = {"none": 5.0, "quick": 180.0, "full": 5400.0}
CHECK_SECONDS = 35.0


@dataclasses.dataclass(frozen=True)
class Combo:
    kernel: str
    dims: dict[str, int]
    dtype: str
    # Where the combo comes from: "model tp=N batch=B seqlen=L" (several when de-duplicated).
    origins: tuple[str, ...]

    @property
    def key(self) -> str:
        return entry_key(self.kernel, self.dims, self.dtype)

    def label(self) -> str:
        return f"{self.kernel} {','.join(f'{k}={v}' for k, v in self.dims.items())} {self.dtype}"


# The origin suffix of a combo that a named kernel's stage launches (KernelKey.runs_too).
RUN_BY = " (run by {})"


def runs_for(combo: Combo, kernels: Collection[str]) -> bool:
    """Whether `combo` is one of these kernels' own, or one that their stages launch (what
    `sweep --kernel` keeps)."""
    return combo.kernel in kernels or any(o.endswith(RUN_BY.format(k)) for k in kernels for o in combo.origins)


def plan(spec: Spec) -> list[Combo]:
    """Each named kernel's combos at each layer shape of the spec, and those of the kernels its
    stage launches too (`KernelKey.runs_too`: origin "... (run by KERNEL)"), each once."""
    kernels = all_keys()
    found: dict[str, Combo] = {}

    def add(name: str, dims: dict[str, int], dtype: str, origin: str) -> None:
        key = entry_key(name, dims, dtype)
        if key in found:
            old = found[key]
            found[key] = dataclasses.replace(old, origins=(*old.origins, origin))
        else:
            found[key] = Combo(kernel=name, dims=dims, dtype=dtype, origins=(origin,))

    for m in spec.models:
        for batch, seqlen, packed in itertools.product(m.batch, m.seqlen, spec.packed_sequences):
            shape = ModelShape(batch=batch, seqlen=seqlen, nheads=m.nheads, headdim=m.headdim,
                               ngroups=m.ngroups, dstate=m.dstate, chunk_size=m.chunk_size, packed=packed)
            origin = f"{m.name} tp={m.tp} batch={batch} seqlen={seqlen}" + (" packed" if packed else "")
            for name in spec.kernels:
                for dims, dtypes, suffix in _weight_variants(spec, kernels[name], shape):
                    for dtype in dtypes:
                        add(name, dims, dtype, origin + suffix)
                for other, dims_for in kernels[name].runs_too:
                    other_dims = dims_for(shape)
                    if other_dims is None:
                        continue
                    for dtype in spec.dtypes:
                        add(other, other_dims, dtype, origin + RUN_BY.format(name))
    return list(found.values())


def _weight_variants(spec: Spec, kernel: KernelKey,
                     shape: ModelShape) -> list[tuple[dict[str, int], list[str], str]]:
    """(dims, dtypes, origin suffix) of one kernel at one shape, per norm weight dtype.

    An fp32 weight serves every dtype; a low-precision one only the dtype it is listed as
    (the weight in the inputs' dtype). Kernels whose dims do not depend on the weight get
    one variant.
    """
    base = kernel.dims_for(shape)
    low_dims = kernel.dims_for(dataclasses.replace(shape, norm_weight_fp32=False))
    if base == low_dims:  # the kernel does not depend on the weight
        return [] if base is None else [(base, list(spec.dtypes), "")]
    variants: list[tuple[dict[str, int], list[str], str]] = []
    if base is not None and "fp32" in spec.norm_weight_dtypes:
        variants.append((base, list(spec.dtypes), ""))
    low = [d for d in spec.dtypes if d in spec.norm_weight_dtypes and d != "fp32"]
    if low_dims is not None and low:
        variants.append((low_dims, low, " norm_weight=" + "/".join(low)))
    return variants


def short_timeout_warning(timeout_s: float | None, budget: Budget) -> str | None:
    """A warning when a sweep's --timeout would likely kill its combos before they finish: under
    twice the plan's estimate of a combo (`estimate_seconds_for`). Helion ends a search at the end
    of the generation in which its budget ran out: on the H200 30 s searches of the
    dB/dC backward ran 61-67 s and their combos took 108-117 s, so `--timeout 90` killed both."""
    if timeout_s is None or budget.effort == "none":
        return None
    estimate = estimate_seconds_for(budget)
    if timeout_s >= 2 * estimate:
        return None
    return (f"--timeout {timeout_s:g} s is under {2 * estimate:.0f} s, twice a combo's estimate "
            f"({estimate:.0f} s: the search budget + {CHECK_SECONDS:.0f} s of set-up and checks); "
            "a search runs past its budget to finish a generation, so combos may be killed before they finish")


def estimate_seconds_for(budget: Budget) -> float:
    """Estimated wall time of one combo under a budget."""
    search = EFFORT_SECONDS[budget.effort]
    if budget.seconds_per_combo is not None:
        search = min(search, float(budget.seconds_per_combo))
    return search + CHECK_SECONDS
