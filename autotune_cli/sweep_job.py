"""A sweep's job, built once from a spec (or a call record) and run by either executor: the
local one (`autotune_cli.sweep`: worker processes on this machine's GPUs) or the Slurm one
(`autotune_cli.slurm`: one job array).

`SweepJob` holds what to tune (combos, budget, tolerances, target GPU, bundle name, spec) and
how (`SweepOptions`), and answers what both executors ask of it: the worker's job file for a
combo (`worker_job`, the one description a worker gets), its time limit, the --warm-start
bundles, the bundle to resume and its stale keys, and what is left to tune. `BundleWriter`
writes each finished combo into the bundle.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from autotune_cli import environment as env
from autotune_cli.plan import Combo
from autotune_cli.search_trace import adopted_note, seconds_to_within
from autotune_cli.spec import Budget, Tolerance
from autotune_cli.warm_start import warm_configs
from mamba_tune.bundle import (
    Bundle,
    BundleError,
    Entry,
    Failure,
    GpuInfo,
    KernelProvenance,
    Provenance,
    SpecRef,
    Versions,
    load_bundle,
    write_bundle,
)
from mamba_tune.keys import all_keys


class SweepInputError(Exception):
    """Bad input or environment: exit code 2, nothing written."""


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    out_dir: Path
    force: bool = False
    gpus: list[int] | None = None
    allow_gpu_mismatch: bool = False
    cpu_dry_run: bool = False
    log_dir: Path = Path(".mamba-tune/logs")
    timeout_s: float | None = None
    # Only part of the spec's combos (--kernel / --origin): the rest of the bundle must stay.
    partial: bool = False
    # Bundles whose entries seed the searches too (--warm-start), beside the one being written.
    warm_start: tuple[Path, ...] = ()
    # A new worker process per combo (--fresh-workers) instead of one kept warm per GPU.
    fresh_workers: bool = False
    # A combo whose key a sibling SKU's --warm-start bundle holds, fresh, takes that entry's config
    # after a check and a timing, with no search (--adopt-sibling; `worker_job`, `tuner.tune`).
    adopt_sibling: bool = False


@dataclasses.dataclass
class ComboResult:
    combo: Combo
    entry: Entry | None
    failure: Failure | None
    seconds: float
    skipped: bool = False


@dataclasses.dataclass
class SweepResult:
    bundle_path: Path
    results: list[ComboResult]

    @property
    def failed(self) -> list[ComboResult]:
        return [r for r in self.results if r.failure is not None]


def bundle_path_for(out_dir: Path, sku: str, name: str) -> Path:
    """OUT/SKU/NAME.json; a name that could leave OUT (`limits.name_problem`) is SweepInputError."""
    from autotune_cli.limits import name_problem

    if why := name_problem(name):
        raise SweepInputError(f"bundle name {why}")
    return out_dir / sku / f"{name}.json"


def fmt_s(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def worker_death(pid: int, returncode: int | None, phase: str | None, seconds: float, maxrss_mb: float) -> str:
    """How a worker that left no result ended (both executors say it the same way): its exit
    code or signal, the phase its status file last named, how long it ran, its peak memory
    (wait4's; Linux counts a forked worker's parent's size before its exec too)."""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "?"
        how = f"was killed by signal {-returncode} ({name}{': out of memory?' if name == 'SIGKILL' else ''})"
    else:
        how = f"exited with code {returncode}"
    phase = phase or "start (imports and set-up; no phase reported yet)"
    return f"the worker (pid {pid}) {how} in phase {phase!r} after {fmt_s(seconds)}, peak RSS {maxrss_mb:.0f} MB"


def describe_entry(e: Entry) -> str:
    t = e.timing
    text = f"{t.tuned_ms:.4f} ms (default {t.default_ms:.4f} ms, {e.speedup.vs_default:.2f}x"
    if t.baseline_ms is not None and e.speedup.vs_baseline is not None:
        text += f"; {t.baseline} {t.baseline_ms:.4f} ms, {e.speedup.vs_baseline:.2f}x"
    within = seconds_to_within(e.search.trace or [], 1.0)
    if e.search.adopted_from is not None:
        text += f"; {adopted_note(e.search.adopted_from)}"
    elif e.search.configs_tried == 1 and e.search.algorithm != "none":
        # Its starting configs' compiles took the budget: it measured one config, searched nothing.
        text += (f"; the search timed 1 config in {e.search.seconds:.0f} s: its compiles took the "
                 f"{e.search.budget_seconds} s budget, raise --seconds-per-combo to search")
    elif within is not None:
        text += f"; the search within 1% of its best at {within:.0f} s of {e.search.seconds:.0f} s"
    return text + ")"


@dataclasses.dataclass(frozen=True)
class SweepJob:
    """What one sweep tunes, and how; the executors read it, never change it."""

    combos: list[Combo]
    budget: Budget
    tolerances: dict[str, Tolerance]
    target_sku: str
    bundle_name: str
    spec_ref: SpecRef | None
    options: SweepOptions

    def worker_job(self, combo: Combo, bundles: list[Bundle], siblings: Sequence[Bundle] = ()) -> dict[str, Any]:
        """The worker's job file (`autotune_cli.worker`) for `combo`: its key, the budget, its
        dtype's tolerance, and the configs the search starts from: its key's and the nearest
        tuned shapes' in `bundles` (`warm_start`: the bundle as written so far, then --warm-start's).
        With --adopt-sibling, `adopt`: the entry of its key in `siblings` (the --warm-start bundles,
        `warm_bundles`) that replaces its search (`adoption`).
        The kernel's tuning record (helion and the kernels: seconds of imports) is loaded only where a
        bundle holds entries of the kernel: a fresh sweep's submitter starts without it."""
        warm: list[dict[str, Any]] = []
        if any(e.kernel == combo.kernel for b in bundles for e in b.entries.values()):
            from autotune_cli.tuning import get

            tk = get(combo.kernel)
            warm = warm_configs(tk.size_dims, combo.kernel, combo.dims, combo.dtype, bundles, across=tk.seed_across)
        job = {"kernel": combo.kernel, "dims": combo.dims, "dtype": combo.dtype, "warm_start": warm,
               "budget": self.budget.model_dump(), "tolerance": self.tolerances[combo.dtype].model_dump()}
        adopt = adoption(combo, siblings) if self.options.adopt_sibling else None
        return job if adopt is None else {**job, "adopt": adopt}

    def adoption_note(self, todo: Sequence[Combo], siblings: Sequence[Bundle]) -> str:
        """For the sweep's opening line, with --adopt-sibling: how many of the combos to tune a
        sibling bundle holds fresh (adopted after a check and a timing, unless that refuses them)."""
        if not self.options.adopt_sibling:
            return ""
        offers = [adoption(c, siblings) for c in todo]
        n = sum(a is not None and "refused" not in a for a in offers)
        skus = sorted({a["from"] for a in offers if a is not None and "refused" not in a})
        return f" ({n} to adopt from {', '.join(skus) or 'a sibling'} after a check, the rest searched)"

    def timeout_s(self) -> float:
        """How long a combo's worker may run: --timeout, else 2 x the search budget + 10 min."""
        if self.options.timeout_s is not None:
            return self.options.timeout_s
        from autotune_cli.plan import EFFORT_SECONDS

        search = float(self.budget.seconds_per_combo or EFFORT_SECONDS[self.budget.effort])
        return 2 * search + 600

    def warm_bundles(self, sku: str) -> list[Bundle]:
        """The --warm-start bundles, each tuned on `sku`, this sweep's, or on a sibling SKU of the
        same arch (an H200 bundle for an H100 sweep: the first tune of a new SKU starts from its
        sibling's winners, which the search times on this GPU like any candidate); SweepInputError
        for any other."""
        from mamba_tune.sku import siblings

        adopt = self.options.adopt_sibling
        if adopt and not self.options.warm_start:
            raise SweepInputError("--adopt-sibling needs --warm-start BUNDLE: the sibling SKU's bundle whose "
                                  "entries it adopts")
        out = []
        for path in self.options.warm_start:
            try:
                bundle = load_bundle(path)
            except BundleError as e:  # it names the file
                raise SweepInputError(f"--warm-start: {str(e).splitlines()[0]}") from None
            got = bundle.provenance.gpu.sku
            if adopt:
                if why := self._not_a_sibling(got, sku):
                    raise SweepInputError(f"--adopt-sibling: --warm-start {path}: {why}")
            elif got != sku and got not in siblings(sku):
                raise SweepInputError(f"--warm-start {path}: tuned on {got}, this sweep tunes on {sku} (only "
                                      f"{' or '.join([sku, *siblings(sku)])} configs are a starting point here)")
            out.append(bundle)
        return out

    def _not_a_sibling(self, got: str, sku: str) -> str | None:
        """Why a bundle tuned on `got` is no sibling to adopt from in a sweep on `sku` (None: it is).
        A CPU dry run (sku cpu) takes a bundle of any GPU SKU, as a new SKU of its arch would: it
        runs the adoption end to end (config fit, check, entry) in ref mode, where no config is timed."""
        from mamba_tune.sku import GPU_SKUS, siblings

        if self.options.cpu_dry_run:
            return None if got != sku else (f"tuned on {got} (a dry run's own); a dry run adopts from a GPU SKU's "
                                            "bundle, standing in for a new SKU of its arch")
        if got == sku:
            return (f"tuned on {sku}, this GPU's own SKU: --adopt-sibling adopts a sibling SKU's entries "
                    f"({' or '.join(siblings(sku)) or 'none known'}); a sweep resumes from its own bundle without it")
        if got not in siblings(sku):
            arch = GPU_SKUS[got].arch if got in GPU_SKUS else "an unknown arch"
            return (f"tuned on {got} ({arch}), not a sibling of {sku} ({GPU_SKUS[sku].arch if sku in GPU_SKUS else '?'}"
                    f": {' or '.join(siblings(sku)) or 'none known'}); another arch's configs are no evidence here")
        return None

    def todo(self, bundle: Bundle | None, stale: set[str]) -> tuple[list[Combo], list[ComboResult]]:
        """The combos to tune (all with --force; else those not in `bundle`, or stale), and a
        result for each one kept as it is in the bundle."""
        done = set() if bundle is None else set(bundle.entries)
        todo = [c for c in self.combos if self.options.force or c.key not in done or c.key in stale]
        kept = [ComboResult(c, bundle.entries[c.key] if bundle else None, None, 0.0, skipped=True)
                for c in self.combos if c not in todo]
        return todo, kept

    def existing(self, path: Path, gpu: GpuInfo, versions: Versions, console: Console
                 ) -> tuple[Bundle | None, set[str]]:
        """The bundle to resume, and the keys in it that must be re-tuned (stale); what is
        dropped or re-tuned, and why, on `console`."""
        bundle = self._resumable(path, gpu, versions)
        if bundle is None:
            return None, set()
        planned = {c.key for c in self.combos}
        if not same_versions(bundle.provenance.versions, versions):
            # Only with --force on the whole spec (`_resumable` refuses the rest).
            for key in sorted(set(bundle.entries) - planned):
                console.print(f"[yellow]dropping {escape(key)}: tuned with other versions and not in this spec")
            bundle = bundle.model_copy(update={
                "entries": {k: v for k, v in bundle.entries.items() if k in planned},
                "failures": {k: v for k, v in bundle.failures.items() if k in planned},
            })
        stale: set[str] = set()
        for name, keys in stale_keys(bundle).items():
            console.print(f"[yellow]{escape(f'{name} changed since {path} was tuned')}: {len(keys)} entries are stale")
            stale |= keys
            # Stale entries outside this spec would keep a provenance that no longer holds.
            drop = keys - planned
            if drop:
                for key in sorted(drop):
                    console.print(f"[yellow]dropping stale {escape(key)}: not in this spec")
                bundle = bundle.model_copy(
                    update={"entries": {k: v for k, v in bundle.entries.items() if k not in drop}})
        # (With --force every combo is re-tuned anyway; a CPU dry run records ref-mode
        # placeholders, which no compiled kernel would take.)
        if not self.options.force and not self.options.cpu_dry_run:
            for key, why in rejected_configs(bundle, planned - stale).items():
                console.print(f"[yellow]{escape(key)}: Helion rejects its config ({escape(why)}); re-tuning it")
                stale.add(key)
        return bundle, stale

    def _resumable(self, path: Path, gpu: GpuInfo, versions: Versions) -> Bundle | None:
        """The bundle at `path` if this run may resume it (None: there is none); else SweepInputError."""
        if not path.exists():
            return None
        try:
            bundle = load_bundle(path)
        except BundleError as e:
            raise SweepInputError(f"cannot resume: {e}; fix it, move it away, or choose another -o") from None
        old = bundle.provenance.gpu
        if (old.name, old.compute_capability) != (gpu.name, gpu.compute_capability):
            raise SweepInputError(
                f"{path} was tuned on {old.name} (sm {old.compute_capability}); this is {gpu.name} "
                f"(sm {gpu.compute_capability}): use another -o"
            )
        ov = bundle.provenance.versions
        if not same_versions(ov, versions):
            tuned_with = (f"{path} was tuned with helion {ov.helion}, torch {ov.torch}, triton {ov.triton}; this is "
                          f"helion {versions.helion}, torch {versions.torch}, triton {versions.triton}")
            if self.options.partial:
                # One bundle holds one set of versions: re-tuning part of it would have to drop
                # the rest, which a filtered run must not do.
                raise SweepInputError(f"{tuned_with}. A bundle holds one set of versions: re-tune the whole spec "
                                      "(no --kernel/--origin) with --force, or use another -o")
            if not self.options.force:
                raise SweepInputError(f"{tuned_with}. Pass --force to re-tune every combo of the spec "
                                      "(entries outside it are dropped)")
        return bundle


def same_versions(a: Versions, b: Versions) -> bool:
    return (a.helion, a.torch, a.triton) == (b.helion, b.torch, b.triton)


def adoption(combo: Combo, siblings: Sequence[Bundle]) -> dict[str, Any] | None:
    """The job's `adopt` (`tuner.tune`) for `combo`: the entry of its key in the first sibling
    bundle that holds it fresh, with the config space it was tuned in; None where no sibling bundle
    holds the key. An entry of a kernel whose source changed since the sibling tuned it
    (`stale_keys`: the runtime's and `check`'s rule) is refused, with why: the worker says so and
    searches."""
    refused = None
    for b in siblings:
        e = b.entries.get(combo.key)
        if e is None:
            continue
        sku = b.provenance.gpu.sku
        if combo.key in stale_keys(b).get(combo.kernel, set()):
            refused = refused or {"from": sku, "refused": f"kernel {combo.kernel} changed since {sku} tuned it"}
            continue
        return {"from": sku, "config": e.config, "config_spec_fingerprint": e.search.config_spec_fingerprint}
    return refused


def stale_keys(bundle: Bundle) -> dict[str, set[str]]:
    """Kernel -> its entry keys, for each kernel whose source changed since the bundle tuned it.
    (From the key schema, which hashes the source without importing it: a Slurm task, `status` and
    `collect` load no torch or helion for it.)"""
    kernels = all_keys()
    stale: dict[str, set[str]] = {}
    for name, prov in bundle.provenance.kernels.items():
        tk = kernels.get(name)
        if tk is not None and prov.source_sha256 != tk.source_sha256():
            stale[name] = {k for k, e in bundle.entries.items() if e.kernel == name}
    return stale


def rejected_configs(bundle: Bundle, keys: set[str]) -> dict[str, str]:
    """Key -> why, for the entries among `keys` whose config Helion rejects at their dims
    (an unknown key, a wrong length, an impossible value): such an entry is not done."""
    from autotune_cli.lowering import config_problem
    from autotune_cli.tuning import all_kernels

    kernels = all_kernels()
    rejected: dict[str, str] = {}
    for key in sorted(keys & bundle.entries.keys()):
        entry = bundle.entries[key]
        tk = kernels.get(entry.kernel)
        why = None if tk is None else config_problem(tk, entry)
        if why is not None:
            rejected[key] = why
    return rejected


class BundleWriter:
    """Persistence: each finished combo's entry or failure goes into the bundle at once,
    rewritten atomically, with the provenance brought up to date."""

    def __init__(self, path: Path, bundle: Bundle | None, gpu: GpuInfo, versions: Versions,
                 spec_ref: SpecRef | None) -> None:
        self.path = path
        self.bundle = bundle
        self.gpu = gpu
        self.versions = versions
        self.spec_ref = spec_ref
        self.created = bundle.provenance.created if bundle else env.now()
        self.kernels: dict[str, KernelProvenance] = dict(bundle.provenance.kernels) if bundle else {}

    def save(self, entry: Entry | None, failure: Failure | None, kprov: KernelProvenance | None) -> None:
        stamp = env.now()
        if kprov is not None:
            name = (entry or failure).kernel  # type: ignore[union-attr]
            old = self.kernels.get(name)
            if old is not None and old.source_sha256 != kprov.source_sha256 and self.bundle is not None:
                # The kernel's record moves to its new source: its entries tuned on the old one
                # (stale, queued for re-tuning) would pass for fresh under it, and a failed
                # re-tune would leave one to run (seen on the H200). They go; the failure or the
                # new entry takes the key.
                self.bundle = self.bundle.model_copy(
                    update={"entries": {k: e for k, e in self.bundle.entries.items() if e.kernel != name}})
            if old is None or old.source_sha256 != kprov.source_sha256:
                # Same source: the record stays as it is (one from before per-entry config-space
                # fingerprints keeps its fingerprint, which describes an entry still here).
                self.kernels[name] = kprov
        prov = Provenance(tool_version=env.tool_version(), git_sha=env.git_sha(), created=self.created,
                          updated=stamp, gpu=self.gpu, versions=self.versions, spec=self.spec_ref,
                          kernels=dict(self.kernels))
        cur = self.bundle or Bundle(provenance=prov)
        cur = cur.model_copy(update={"provenance": prov})
        cur = cur.with_entry(entry, updated=stamp) if entry is not None else cur.with_failure(failure, updated=stamp)  # type: ignore[arg-type]
        write_bundle(cur, self.path)
        self.bundle = cur
