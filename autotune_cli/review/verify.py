"""Re-run every entry of a bundle on this GPU: compiles, numerics, still worth having.

For each entry, on the current CUDA device:

1. the recorded config compiles (`BoundKernel.compile_config`);
2. it passes the numerics check against the fp32 reference with the tolerance the entry
   was accepted with (entry.accuracy: err <= factor * err(eager torch in dtype) + atol),
   on the inputs the tuner checked it on (seed = entry.search.seed + 1, unless --seed);
3. it is not slower than the kernel's default config beyond a noise margin (both timed now,
   with the same do_bench as the tuner, on the whole op: kernel plus host epilogue);
4. it is not slower than its recorded tuned_ms beyond a regression margin: what a
   helion, triton, torch or driver upgrade does to a config shows up here.

With `against` (a bundle of a sibling SKU of the same arch: `review.sku_compare`), each entry
whose key that bundle also holds has the sibling's config compiled, checked on the same
inputs (with the tolerance its own entry was accepted with) and timed the same way, in the
same process: what tuning on this SKU buys over borrowing the sibling's entry. The
sibling's result is for the record; it does not fail the entry.

Timing margins exist because two do_bench medians of the same config differ by a few
percent between processes; they are options, not silent slack.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from typing import Any

from autotune_cli import environment as env
from autotune_cli.spec import Tolerance
from mamba_tune.bundle import Bundle, Entry, GpuInfo, Versions


class VerifyInputError(Exception):
    """Cannot verify here (no GPU, another GPU, ref mode): exit code 2."""


@dataclasses.dataclass(frozen=True)
class Margins:
    noise_pct: float = 3.0  # tuned may be at most this much slower than default
    regression_pct: float = 10.0  # and at most this much slower than recorded


@dataclasses.dataclass
class EntryResult:
    key: str
    ok: bool
    reasons: list[str]
    recorded_tuned_ms: float
    recorded_default_ms: float
    tuned_ms: float | None = None
    default_ms: float | None = None
    baseline_ms: float | None = None
    baseline: str | None = None
    same_as_default: bool = False
    max_abs_err: dict[str, float] = dataclasses.field(default_factory=dict)
    bound: dict[str, float] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    # --against: the sibling bundle's entry for this key (in_other), timed here, or why not.
    in_other: bool = False
    other_ms: float | None = None
    same_as_other: bool = False
    other_reasons: list[str] = dataclasses.field(default_factory=list)

    @property
    def vs_default(self) -> float | None:
        return None if self.tuned_ms is None or self.default_ms is None else self.default_ms / self.tuned_ms

    @property
    def vs_recorded_pct(self) -> float | None:
        return None if self.tuned_ms is None else (self.tuned_ms / self.recorded_tuned_ms - 1.0) * 100.0

    @property
    def vs_other(self) -> float | None:
        """The sibling entry's time over ours (above 1: this SKU's own entry is faster)."""
        return None if self.tuned_ms is None or self.other_ms is None else self.other_ms / self.tuned_ms

    @property
    def vs_baseline(self) -> float | None:
        return None if self.tuned_ms is None or self.baseline_ms is None else self.baseline_ms / self.tuned_ms

    @property
    def kernel(self) -> str:
        return self.key.split("|")[0]

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel} | dataclasses.asdict(self) | {
            "vs_default": self.vs_default, "vs_recorded_pct": self.vs_recorded_pct, "vs_other": self.vs_other,
            "vs_baseline": self.vs_baseline}


@dataclasses.dataclass(frozen=True)
class Against:
    """--against: the sibling bundle, and the keys only one of the two bundles holds."""

    path: str
    gpu: GpuInfo
    only_ours: list[str]
    only_other: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"bundle": self.path, "gpu": self.gpu.model_dump(), "only_ours": self.only_ours,
                "only_other": self.only_other}


@dataclasses.dataclass
class VerifyResult:
    gpu: GpuInfo
    versions: Versions
    bundle_gpu: GpuInfo
    bundle_versions: Versions
    margins: Margins
    started: str
    results: list[EntryResult]
    against: Against | None = None

    @property
    def failed(self) -> list[EntryResult]:
        return [r for r in self.results if not r.ok]

    def to_json(self, bundle_path: str) -> dict[str, Any]:
        return {
            "bundle": bundle_path, "started": self.started, "finished": env.now(),
            "gpu": self.gpu.model_dump(), "versions": self.versions.model_dump(),
            "bundle_gpu": self.bundle_gpu.model_dump(), "bundle_versions": self.bundle_versions.model_dump(),
            "margins": dataclasses.asdict(self.margins), "ok": not self.failed,
            "entries": [r.to_json() | {"card": self.gpu.sku} for r in self.results],
        } | ({} if self.against is None else {"against": self.against.to_json()})


# --- pure rules (no GPU): tested on the CPU ----------------------------------------------


def target_problem(bundle_gpu: GpuInfo, here: GpuInfo) -> str | None:
    """Why this GPU cannot verify the bundle (another compute capability), or None."""
    if bundle_gpu.compute_capability != here.compute_capability:
        return (f"the bundle was tuned on {bundle_gpu.name} (sm {bundle_gpu.compute_capability}) but this GPU is "
                f"{here.name} (sm {here.compute_capability}); pass --allow-arch-mismatch to verify it here anyway")
    return None


def timing_reasons(entry: Entry, tuned_ms: float, default_ms: float, same_as_default: bool,
                   margins: Margins) -> list[str]:
    """Why the timings measured now fail the entry (empty: they pass)."""
    reasons: list[str] = []
    if not same_as_default and tuned_ms > default_ms * (1.0 + margins.noise_pct / 100.0):
        reasons.append(f"slower than the kernel's default config: {tuned_ms:.4f} ms vs {default_ms:.4f} ms "
                       f"(+{(tuned_ms / default_ms - 1) * 100:.1f}%, margin {margins.noise_pct:g}%)")
    recorded = entry.timing.tuned_ms
    if tuned_ms > recorded * (1.0 + margins.regression_pct / 100.0):
        reasons.append(f"regressed vs the recorded timing: {tuned_ms:.4f} ms now, {recorded:.4f} ms recorded "
                       f"(+{(tuned_ms / recorded - 1) * 100:.1f}%, margin {margins.regression_pct:g}%)")
    return reasons


def describe(r: EntryResult) -> str:
    if r.tuned_ms is None:
        return "; ".join(r.reasons)
    text = f"{r.tuned_ms:.4f} ms (default {r.default_ms:.4f} ms, {r.vs_default:.2f}x; recorded " \
           f"{r.recorded_tuned_ms:.4f} ms, {r.vs_recorded_pct:+.1f}%"
    if r.baseline_ms is not None:
        text += f"; {r.baseline} {r.baseline_ms:.4f} ms, {r.baseline_ms / r.tuned_ms:.2f}x"
    if r.in_other:
        text += "; sibling's entry " + (f"{r.other_ms:.4f} ms, {r.vs_other:.2f}x" if r.vs_other is not None
                                        else "not timed: " + "; ".join(r.other_reasons or ["this entry failed"]))
        text += " (the same config)" if r.same_as_other else ""
    text += ")"
    return text + ("" if r.ok else ": " + "; ".join(r.reasons))


# --- the GPU run ------------------------------------------------------------------------


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def environment_check(bundle: Bundle, allow_arch_mismatch: bool) -> GpuInfo:
    """This machine's GPU, or VerifyInputError (no CUDA GPU, ref mode, another arch)."""
    import torch

    if not torch.cuda.is_available():
        g = bundle.provenance.gpu
        raise VerifyInputError(f"no CUDA GPU visible: verify re-runs every entry on the GPU; run it on a {g.name} "
                               f"(sm {g.compute_capability}) machine")
    if os.environ.get("HELION_INTERPRET") == "1":
        raise VerifyInputError("HELION_INTERPRET=1 (Helion ref mode) compiles nothing: unset it to verify configs")
    here = env.gpu_info(torch.cuda.current_device())
    problem = target_problem(bundle.provenance.gpu, here)
    if problem is not None and not allow_arch_mismatch:
        raise VerifyInputError(problem)
    return here


def _compile_and_check(bound: Any, config: Any, check: Any, accuracy: Any) -> tuple[Callable[..., Any] | None, Any, str]:
    """Compile `config` and check its outputs on `check` with an entry's tolerance (`accuracy`):
    (the compiled function, the numerics, "") or (None, the numerics if measured, why not)."""
    import torch

    from autotune_cli.tuner import TuneFailure, accuracy_reason, check_accuracy

    try:
        fn: Callable[..., Any] = bound.compile_config(config, allow_print=False)
    except Exception as e:  # the compiler's verdict on this config, reported per entry
        return None, None, f"does not compile: {_first_line(e)}"
    try:
        acc = check_accuracy(check, check.run(fn), Tolerance(atol=accuracy.atol, factor=accuracy.factor))
        torch.cuda.synchronize()
    except TuneFailure as e:
        return None, None, f"wrong outputs: {e}"
    except Exception as e:  # Triton compiles at the first launch: its errors land here too
        return None, None, f"does not run: {_first_line(e)}"
    return (fn, acc, "") if acc.passed else (None, acc, accuracy_reason(acc))


def verify_entry(entry: Entry, margins: Margins, seed: int | None, other: Entry | None = None) -> EntryResult:
    """Verify one entry; with `other` (the sibling bundle's entry for the same key), also check
    and time its config on the same inputs, right after ours."""
    import helion
    import torch

    from autotune_cli.tuner import bench_ms
    from autotune_cli.tuning import all_kernels
    from mamba_tune.vocab import torch_dtype

    res = EntryResult(key=entry.key, ok=False, reasons=[], recorded_tuned_ms=entry.timing.tuned_ms,
                      recorded_default_ms=entry.timing.default_ms, in_other=other is not None)
    tk = all_kernels().get(entry.kernel)
    if tk is None:
        res.reasons.append(f"unknown kernel {entry.kernel!r} (not in this checkout's registry)")
        return res
    device = torch.device("cuda", torch.cuda.current_device())
    dtype = torch_dtype(entry.dtype)
    check_seed = entry.search.seed + 1 if seed is None else seed
    try:
        problem = tk.make_problem(entry.dims, dtype, device, entry.search.seed)
        check = tk.make_problem(entry.dims, dtype, device, check_seed)
        bound = tk.kernel.bind(problem.args)
        default = tk.default_for(bound, entry.dims)
        config = helion.Config.from_dict(entry.config)
        res.same_as_default = config == default
    except Exception as e:  # bad dims for this kernel, inputs that do not fit: a finding
        res.reasons.append(f"cannot build the problem: {_first_line(e)}")
        return res
    fn, acc, why = _compile_and_check(bound, config, check, entry.accuracy)
    if acc is not None:
        res.max_abs_err, res.bound = dict(acc.max_abs_err), dict(acc.bound)
    if fn is None:
        res.reasons.append(why)
        return res
    fn_other = None if other is None else _checked_other(res, other, config, bound, check)
    fn_default = fn if res.same_as_default else bound.compile_config(default, allow_print=False)
    res.tuned_ms = bench_ms(lambda: problem.run(fn), device)
    if res.same_as_other:
        res.other_ms = res.tuned_ms
    elif fn_other is not None:
        res.other_ms = bench_ms(lambda: problem.run(fn_other), device)
    res.default_ms = res.tuned_ms if res.same_as_default else bench_ms(lambda: problem.run(fn_default), device)
    if tk.make_baseline is not None:
        # For the record only: a baseline that cannot run says nothing about the entry.
        try:
            base = tk.make_baseline(entry.dims, dtype, device, entry.search.seed)
            if base is not None:
                res.baseline_ms, res.baseline = bench_ms(base.fn, device), base.name
        except Exception as e:  # mamba-ssm missing a kernel for this shape, say
            res.baseline = f"unavailable ({_first_line(e)})"
    res.reasons += timing_reasons(entry, res.tuned_ms, res.default_ms, res.same_as_default, margins)
    res.ok = not res.reasons
    return res


def _checked_other(res: EntryResult, other: Entry, ours: Any, bound: Any, check: Any) -> Callable[..., Any] | None:
    """The sibling entry's config, compiled and checked like ours: its function, or None (the
    same config as ours: res.same_as_other; or why it cannot run: res.other_reasons)."""
    import helion

    try:
        config = helion.Config.from_dict(other.config)
    except Exception as e:  # a config of another version of the kernel, say
        res.other_reasons.append(f"not a config of this kernel: {_first_line(e)}")
        return None
    if config == ours:
        res.same_as_other = True
        return None
    fn, _, why = _compile_and_check(bound, config, check, other.accuracy)
    if fn is None:
        res.other_reasons.append(why)
    return fn


def _context_broken() -> str | None:
    """A sticky CUDA error (illegal address, ...) poisons every later launch in the process."""
    import torch

    try:
        torch.cuda.synchronize()
    except Exception as e:  # any error here means the context is gone
        return _first_line(e)
    return None


def verify_bundle(
    bundle: Bundle,
    *,
    margins: Margins = Margins(),
    seed: int | None = None,
    kernels: list[str] | None = None,
    allow_arch_mismatch: bool = False,
    against: tuple[str, Bundle] | None = None,
    progress: Callable[[int, int, Entry, EntryResult | None], None] | None = None,
) -> VerifyResult:
    """Verify the entries (of `kernels`, or all) on this GPU, each against the entry for its key in
    the `against` bundle (path, bundle: a sibling SKU's, checked by the caller) if that holds
    one; VerifyInputError if it cannot."""
    here = environment_check(bundle, allow_arch_mismatch)
    started = env.now()
    entries = [e for e in bundle.entries.values() if kernels is None or e.kernel in kernels]
    others = {} if against is None else {k: e for k, e in against[1].entries.items()
                                         if kernels is None or e.kernel in kernels}
    results: list[EntryResult] = []
    broken: str | None = None
    for i, entry in enumerate(entries, 1):
        if progress is not None:
            progress(i, len(entries), entry, None)
        if broken is not None:
            r = EntryResult(entry.key, False, [f"not run: the CUDA context broke earlier ({broken})"],
                            entry.timing.tuned_ms, entry.timing.default_ms)
        else:
            t0 = time.perf_counter()
            try:
                r = verify_entry(entry, margins, seed, others.get(entry.key))
            except Exception as e:  # an unexpected error in one entry must not hide the others
                r = EntryResult(entry.key, False, [f"error: {_first_line(e)}"], entry.timing.tuned_ms,
                                entry.timing.default_ms)
            r.seconds = round(time.perf_counter() - t0, 2)
            if not r.ok or r.other_reasons:
                broken = _context_broken()
        results.append(r)
        if progress is not None:
            progress(i, len(entries), entry, r)
    for r in results:  # JSON has no inf/nan
        r.max_abs_err = {k: (v if math.isfinite(v) else 1e30) for k, v in r.max_abs_err.items()}
    info = None if against is None else Against(
        against[0], against[1].provenance.gpu, sorted(k for k in (e.key for e in entries) if k not in others),
        sorted(k for k in others if k not in bundle.entries))
    return VerifyResult(gpu=here, versions=env.versions(), bundle_gpu=bundle.provenance.gpu,
                        bundle_versions=bundle.provenance.versions, margins=margins, started=started,
                        results=results, against=info)
