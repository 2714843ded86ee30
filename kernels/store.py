"""Bundles on disk -> the config a kernel key runs: discovery, SKU tiers, exact and nearest.

The runtime (`mamba_tune.runtime`) keeps one `ConfigStore` per GPU it runs on; the store
reads the bundles once, indexes a kernel's entries the first time that kernel is
resolved, and answers without searching. The lookup order is an explicit mode
(`mamba_tune.configure(mode=...)`, overridable by its variable, mamba_tune.env.CONFIG_MODE):

- ``exact``: only an entry whose key equals the call's key.
- ``nearest`` (default): exact, else the entry of the same kernel, dtype and structural
  dims (every dim not in the kernel's ``size_dims``) whose size dims are closest in
  log-space, with each size dim within a factor of ``NEAREST_MAX_RATIO`` of the call's.
  A kernel's ``neutral_dims`` (structural dims that do not change its config space, such
  as the norm's weight dtype) may differ too, but only where no entry matches them.
- ``default``: ignore bundles and use the kernel's default config.

Bundles are per GPU SKU (`generated_configs/<sku>/`, the SKU named by `mamba_tune.sku`,
the rule `mamba-tune sweep` names its folder with). A call reads the bundles of its GPU's
compute capability in two tiers, this SKU's and then its siblings' (another SKU of the
same compute capability, e.g. the H200's bundles on an H100), whatever the path order:

    this SKU exact > this SKU nearest > sibling exact > sibling nearest > default

(``exact`` mode skips both nearest steps). A config is measured on one card: its best
tile sizes and stages follow that card's memory bandwidth and SM count, so an entry this
GPU's own tuning chose at a nearby shape is a better guess than one another card chose at
the exact shape, and what a SKU runs wherever its own bundles have an applicable entry
does not change when a sibling's bundle is added or removed (`mamba-tune check` and
`diff` of its folder say what it runs). A sibling's entry is a fallback and says so: the
source reads ``exact (tuned on h200, running on h100) <bundle>``, the call recorder
counts it apart, and the first one logs a warning naming the command that tunes this SKU.

Whatever the mode, a call that finds no entry runs the kernel's default config and warns
once, naming the missing key and the command that tunes it. A GPU that no bundle was
tuned for (no bundle of its compute capability, e.g. an A100 or a B200 with only sm90
bundles shipped) runs every kernel's default config with one warning per process that
names its SKU and how to tune for it: another compute capability's configs are not
used, since nothing on the run-time path can tell whether their tiles and stages fit this
GPU's shared memory and registers (a config that does not fit fails at launch, inside
the training step). Bundles for a kernel whose source has changed since are skipped with
one warning, and so is an entry whose config holds a value no Helion config may hold
(`mamba_tune.config_schema`, checked on load; the bundle's other entries stay usable).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from mamba_tune import env
from mamba_tune.bundle import Bundle, BundleError, Entry, entry_key, find_bundles, load_bundle
from mamba_tune.sku import GPU_SKUS, Gpu

log = logging.getLogger("mamba_tune")

NEAREST_MAX_RATIO = 4.0
ENV_CONFIGS = env.CONFIGS


class Mode(str, enum.Enum):
    exact = "exact"
    nearest = "nearest"
    default = "default"


class KeyedKernel(Protocol):
    """What the store reads of a `mamba_tune.runtime.RuntimeKernel`."""

    @property
    def name(self) -> str: ...
    @property
    def size_dims(self) -> tuple[str, ...]: ...
    @property
    def neutral_dims(self) -> tuple[str, ...]: ...
    def source_sha256(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class Resolution:
    config: dict[str, Any] | None  # None: the kernel's default config
    # "exact <bundle>", "nearest <key> <bundle>", "default"; an entry of a sibling SKU
    # says so after exact or nearest: "exact (tuned on h200, running on h100) <bundle>".
    source: str
    key: str
    tuned_on: str | None = None  # the SKU the entry was tuned on (None: no entry)
    running_on: str | None = None  # the SKU of the GPU the call runs on (None: no GPU)

    @property
    def sibling(self) -> bool:
        """Served by an entry tuned on another SKU of this GPU's compute capability (a fallback)."""
        return self.tuned_on is not None and self.running_on is not None and self.tuned_on != self.running_on

    @property
    def sku_note(self) -> str:
        """ "tuned on h200, running on h100" for a sibling's entry, else ""."""
        return f"tuned on {self.tuned_on}, running on {self.running_on}" if self.sibling else ""


@dataclasses.dataclass
class _KernelIndex:
    # One kernel's usable entries in one tier (this SKU's bundles, or its siblings'):
    # dtype -> list of (entry, bundle path), and key -> (entry, bundle path), the first
    # bundle winning a duplicate key.
    by_dtype: dict[str, list[tuple[Entry, Path]]]
    exact: dict[str, tuple[Entry, Path]]


def shipped_bundle_root() -> Path:
    """The bundles installed with mamba_tune: the folder generated_configs/ beside the
    package's own (the wheel installs both at the top level; the repository, which an
    editable install and the device's PYTHONPATH use, holds kernels/ and generated_configs/
    side by side). Found from this file, not by importing the name `generated_configs`: a
    folder of that name in the working directory (a sweep's output) would shadow it."""
    root = Path(__file__).resolve().parent.parent / "generated_configs"
    if not (root / "__init__.py").is_file():
        raise FileNotFoundError(f"mamba_tune: no shipped bundles at {root} (a broken install?): reinstall "
                                f"mamba-tune, or name the bundles to read in {ENV_CONFIGS}")
    return root


def default_bundle_paths() -> list[Path]:
    forced = env.read(ENV_CONFIGS)
    if forced is not None:
        return forced
    return [shipped_bundle_root()]


class ConfigStore:
    """The bundles one GPU reads, indexed for exact and nearest lookup in two tiers: its
    SKU's bundles, then its siblings' (other SKUs of its compute capability). With no GPU
    (`gpu` None: Helion ref mode, a record on the CPU) every bundle, of any compute
    capability, in path order, is one tier."""

    def __init__(self, paths: Sequence[Path], gpu: Gpu | None, warn: Callable[[str], None]):
        self.paths = list(paths)
        self.gpu = gpu
        self._warn = warn
        self._tiers: list[list[tuple[Bundle, Path]]] | None = None
        self._skipped: set[str] = set()  # "h200 (sm90)" of the bundles of another compute capability
        self._indexes: dict[str, list[_KernelIndex]] = {}
        self._sku_of: dict[Path, str] = {}  # bundle path -> the SKU it was tuned on

    def _load(self) -> list[list[tuple[Bundle, Path]]]:
        """The usable bundles: [this SKU's, its siblings'] (or [all] with no GPU), each in path order (read once)."""
        if self._tiers is not None:
            return self._tiers
        own: list[tuple[Bundle, Path]] = []
        siblings: list[tuple[Bundle, Path]] = []
        for path in find_bundles(self.paths):
            try:
                bundle: Bundle = load_bundle(path, skip_bad_config=self._skip_entry)
            except BundleError as e:
                self._warn(f"ignoring bundle: {e}")
                continue
            tuned = bundle.provenance.gpu
            self._sku_of[path] = tuned.sku
            if self.gpu is None or tuned.sku == self.gpu.sku and tuned.compute_capability == self.gpu.compute_capability:
                own.append((bundle, path))
            elif tuned.compute_capability == self.gpu.compute_capability:
                siblings.append((bundle, path))
            else:
                log.info("skipping %s: tuned on %s (sm %s), this GPU is sm %s", path, tuned.name,
                         tuned.compute_capability, self.gpu.compute_capability)
                self._skipped.add(f"{tuned.sku} ({tuned.arch})")
        self._tiers = [own] if self.gpu is None else [own, siblings]
        log.info("loaded %d tuned configs (%d of them tuned on another SKU) from %s",
                 sum(len(b.entries) for b, _ in own + siblings), sum(len(b.entries) for b, _ in siblings),
                 ", ".join(map(str, self.paths)))
        return self._tiers

    def _skip_entry(self, line: str) -> None:
        self._warn(f"ignoring bundle entry: {line}; its shape runs the kernel's default config")

    def no_bundle_warning(self) -> str | None:
        """The one warning for a GPU that no bundle was tuned for (none of its compute capability), else None."""
        if self.gpu is None or any(self._load()):
            return None
        g = self.gpu
        found = f"the bundles found are for {', '.join(sorted(self._skipped))}" if self._skipped else "no bundle found"
        known = "" if g.sku in GPU_SKUS else f" (first add {g.sku} to GPU_SKUS in mamba_tune/sku.py)"
        return (f"mamba-tune: no tuned configs for this GPU, {g.name} ({g.sku}, {g.arch}): {found} in "
                f"{', '.join(map(str, self.paths))}; every kernel runs its default config. Tune for it on this GPU"
                f"{known}: `mamba-tune sweep sweeps/<spec>.yaml` with the spec's `target: {{gpu: {g.sku}}}`, or "
                f"record a run with MAMBA_TUNE_RECORD=calls.json and `mamba-tune sweep --from-record calls.json`")

    def _index(self, rk: KeyedKernel) -> list[_KernelIndex]:
        """One kernel's entries per tier; a bundle that tuned an older source of it is skipped with a warning."""
        tiers = self._indexes.get(rk.name)
        if tiers is None:
            source_sha256 = rk.source_sha256()
            tiers = self._indexes[rk.name] = [self._index_tier(rk, source_sha256, t) for t in self._load()]
        return tiers

    def _index_tier(self, rk: KeyedKernel, source_sha256: str, bundles: list[tuple[Bundle, Path]]) -> _KernelIndex:
        index = _KernelIndex(by_dtype={}, exact={})
        for bundle, path in bundles:
            prov = bundle.provenance.kernels.get(rk.name)
            if prov is not None and prov.source_sha256 != source_sha256:
                self._warn(
                    f"{path}: kernel {rk.name} changed since it was tuned (source hash "
                    f"{prov.source_sha256[:12]} != {source_sha256[:12]}); its entries are not used. "
                    f"`mamba-tune sweep SPEC` re-tunes them"
                )
                continue
            for key, entry in bundle.entries.items():
                if entry.kernel != rk.name:
                    continue
                if key in index.exact:
                    log.info("%s: %s also in %s; keeping the first", path, key, index.exact[key][1])
                    continue
                index.exact[key] = (entry, path)
                index.by_dtype.setdefault(entry.dtype, []).append((entry, path))
        return index

    def resolve(self, rk: KeyedKernel, dims: dict[str, int], dtype: str, mode: Mode) -> Resolution:
        """The rule of the module docstring: per tier (this SKU, then its siblings), exact then nearest."""
        key = entry_key(rk.name, dims, dtype)
        if mode is Mode.default:
            return Resolution(None, "default (mode=default)", key)
        for index in self._index(rk):
            hit = index.exact.get(key)
            if hit is not None:
                return self._served(hit, "exact", key)
            if mode is Mode.nearest:
                near = nearest_entry(rk, dims, [e for e, _ in index.by_dtype.get(dtype, [])])
                if near is not None:
                    return self._served(index.exact[near.key], f"nearest {near.key}", key)
        return Resolution(None, "default", key)

    def _served(self, hit: tuple[Entry, Path], how: str, key: str) -> Resolution:
        entry, path = hit
        res = Resolution(dict(entry.config), "", key, tuned_on=self._sku_of[path],
                         running_on=None if self.gpu is None else self.gpu.sku)
        note = f" ({res.sku_note})" if res.sibling else ""
        return dataclasses.replace(res, source=f"{how}{note} {path}")


def nearest_entry(rk: KeyedKernel, dims: dict[str, int], candidates: Sequence[Entry]) -> Entry | None:
    """The documented nearest rule (see the module docstring); ties go to the smaller shape.
    An entry that differs in a neutral dim ranks after every entry that does not."""
    best: tuple[int, float, tuple[int, ...], Entry] | None = None
    for entry in candidates:
        if entry.dims.keys() != dims.keys():
            continue
        if any(entry.dims[d] != dims[d] for d in dims if d not in rk.size_dims and d not in rk.neutral_dims):
            continue
        crossed = sum(entry.dims[d] != dims[d] for d in rk.neutral_dims)
        dist = 0.0
        ok = True
        for d in rk.size_dims:
            a, b = entry.dims[d], dims[d]
            if a <= 0 or b <= 0 or max(a, b) / min(a, b) > NEAREST_MAX_RATIO:
                ok = False
                break
            dist += abs(math.log(a / b))
        if not ok:
            continue
        rank = (crossed, dist, tuple(entry.dims[d] for d in rk.size_dims), entry)
        if best is None or rank[:3] < best[:3]:
            best = rank
    return None if best is None else best[3]
