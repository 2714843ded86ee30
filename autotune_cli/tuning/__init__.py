"""The tunable kernels: what the sweep tunes, listed explicitly by family.

Each family's module (`norm.py`, `ssd/`, `conv1d.py`) holds one `TunableKernel` per Helion kernel: the
kernel's runtime declaration (from `kernels/`, its key from `mamba_tune.keys`) plus how to build
inputs for a shape, check outputs against the fp32 reference, time a baseline and seed the search.
Every key in `mamba_tune.keys` has exactly one record here (checked at import).
"""

from __future__ import annotations

from autotune_cli.tuning import conv1d, norm, ssd
from autotune_cli.tuning.record import (
    Baseline,
    ModelShape,
    Problem,
    TunableKernel,
    mamba_ssm_version,
)
from mamba_tune.keys import all_keys

KERNELS: tuple[TunableKernel, ...] = (*norm.KERNELS, *ssd.KERNELS, *conv1d.KERNELS)


def _by_name(kernels: tuple[TunableKernel, ...]) -> dict[str, TunableKernel]:
    named: dict[str, TunableKernel] = {}
    for tk in kernels:
        if tk.name in named:
            raise ValueError(f"kernel {tk.name!r} listed twice")
        named[tk.name] = tk
    unlisted = sorted(set(all_keys()) - set(named))
    if unlisted:
        raise ValueError(f"no tuning record for kernel {', '.join(unlisted)} (mamba_tune.keys declares it): add "
                         "one to its family's KERNELS in autotune_cli/tuning/")
    return dict(sorted(named.items()))


_KERNELS = _by_name(KERNELS)


def all_kernels() -> dict[str, TunableKernel]:
    """Name -> tuning record, sorted by name."""
    return dict(_KERNELS)


def get(name: str) -> TunableKernel:
    if name not in _KERNELS:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(_KERNELS)}")
    return _KERNELS[name]


__all__ = ["Baseline", "KERNELS", "ModelShape", "Problem", "TunableKernel", "all_kernels", "get",
           "mamba_ssm_version"]
