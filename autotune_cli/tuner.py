"""Tune one combo: real Helion search, accuracy check against the fp32 reference, timing.

Runs inside a worker process (autotune_cli.worker), one combo per process, so that a
crash, a hang or a CUDA error in one combo cannot take the sweep down.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import helion
import torch

from autotune_cli.environment import now
from autotune_cli.lowering import config_problem_at, config_spec
from autotune_cli.search_trace import (
    ACCURACY_ERROR,
    SearchLog,
    describe_search_log,
    read_helion_log,
)
from autotune_cli.spec import Budget, Tolerance
from autotune_cli.timing import gpu_median_ms
from autotune_cli.tuning import Problem, TunableKernel, get
from autotune_cli.warm_start import seed_configs
from mamba_tune import env
from mamba_tune.bundle import Accuracy, Entry, Failure, KernelProvenance, Search, Speedup, Timing
from mamba_tune.vocab import torch_dtype


class TuneFailure(Exception):
    """A combo that produced no usable config; the message is the recorded reason."""


class BudgetRanOut(TuneFailure):
    """A search whose budget clock ran out before it timed any config (`no_config_reason`'s
    case): `spent` is the seconds it ran, most of them its first configs' compiles."""

    def __init__(self, reason: str, spent: float) -> None:
        super().__init__(reason)
        self.spent = spent


def retry_budget(budget: Budget, spent: float) -> Budget:
    """The budget of the one retry a search that timed nothing gets: its own plus the seconds
    the first attempt ran (whole seconds, up). The retry runs in the same process with the same
    random seed, so its first configs are the ones just compiled, now in Triton's cache. Not for a
    search whose configs failed Helion's accuracy check (`no_config_reason`): more time does not help
    there."""
    return budget.model_copy(update={"seconds_per_combo": (budget.seconds_per_combo or 0) + math.ceil(spent)})


class ContextLost(TuneFailure):
    """A config hit an unrecoverable CUDA error (illegal or misaligned address) in this
    process: the CUDA context is gone, so the search cannot go on here. Helion benchmarks
    configs in a killable subprocess only for kernels that write none of their arguments;
    the others run in-process unless precompile is `spawn` (each config first runs in its
    own process, and one that crashes there is skipped)."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    entry: Entry | None
    failure: Failure | None
    kernel: KernelProvenance
    # Wall seconds per phase of the tune, in order: setup (inputs, bind), search, check (the
    # winner's fp32 check, compiles included), timing (winner and default), baseline (mamba-ssm's
    # kernels, their first-call autotune included). A failed tune has the phases it reached.
    phases: tuple[tuple[str, float], ...] = ()


def ref_mode(tk: TunableKernel) -> bool:
    """Helion ref mode (HELION_INTERPRET=1): kernel bodies run eagerly, nothing compiles."""
    from helion.runtime.settings import RefMode

    return tk.kernel.settings.ref_mode != RefMode.OFF


def check_accuracy(problem: Problem, result: Any, tol: Tolerance) -> Accuracy:
    """err(kernel) <= factor * err(eager torch in the same dtype) + atol, per output."""
    got = problem.outputs(result)
    ref = problem.reference()
    lowp = problem.lowp_reference()
    max_err: dict[str, float] = {}
    lowp_err: dict[str, float] = {}
    bound: dict[str, float] = {}
    passed = True
    for name, r in ref.items():
        if name not in got:
            raise TuneFailure(f"kernel output {name!r} missing (has {sorted(got)})")
        g = got[name].float()
        if g.shape != r.shape:
            raise TuneFailure(f"output {name} has shape {tuple(g.shape)}, reference {tuple(r.shape)}")
        finite = bool(torch.isfinite(g).all())
        e = float((g - r).abs().max()) if finite else math.inf
        el = float((lowp[name].float() - r).abs().max())
        b = tol.factor * el + tol.atol
        max_err[name], lowp_err[name], bound[name] = e, el, b
        passed = passed and finite and e <= b
    return Accuracy(passed=passed, atol=tol.atol, factor=tol.factor,
                    max_abs_err={k: _finite(v) for k, v in max_err.items()}, lowp_abs_err=lowp_err, bound=bound)


def _finite(v: float) -> float:
    # JSON has no inf; a non-finite error never reaches a bundle entry (it fails the check).
    return v if math.isfinite(v) else 1e30


def accuracy_reason(acc: Accuracy) -> str:
    bad = [f"{k}: err {acc.max_abs_err[k]:.3g} > bound {acc.bound[k]:.3g}"
           for k in acc.max_abs_err if not acc.max_abs_err[k] <= acc.bound[k]]
    return "numerics check failed against the fp32 reference (" + "; ".join(bad) + ")"


def bench_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """Median ms: triton.testing.do_bench on CUDA (L2 flushed between runs), wall clock on CPU."""
    if device.type == "cuda":
        return gpu_median_ms(fn, rep_ms=100)
    fn()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


class _Heartbeat:
    """Writes {'phase', 'best_ms', 'configs'} to a status file while the search runs."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.phase = "starting"
        self.search: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _Heartbeat:
        if self.path:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.write()

    def write(self) -> None:
        if not self.path:
            return
        best = getattr(self.search, "best_perf_so_far", math.inf) if self.search is not None else math.inf
        metrics = getattr(self.search, "_autotune_metrics", None)
        status = {"phase": self.phase, "best_ms": best if math.isfinite(best) else None,
                  "configs": getattr(metrics, "num_configs_tested", None), "time": time.time()}
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, self.path)

    def _loop(self) -> None:
        while not self._stop.wait(2.0):
            try:
                self.write()
            except OSError:
                pass


def fitting_seeds(seeds: Sequence[Any], default: Any) -> list[Any]:
    """The seeds whose list-valued settings (block sizes, one indexing mode per load, one
    setting per loop...) have the lengths they have in this kernel's default config.

    A warm start can come from an entry tuned on an earlier version of the kernel (a re-tune
    after a change starts from the stale entry's config). Helion 1.5.0 does not skip such a
    seed: its search fails on a bare AssertionError (seen on the H200: the dx backward, after
    losing a loop, had 19 loads and its old entry 24 indexing modes). Dropped, with a line.
    """
    lengths = {k: len(v) for k, v in default.config.items() if isinstance(v, list)}
    kept = []
    for seed in seeds:
        wrong = [k for k, v in seed.config.items() if isinstance(v, list) and k in lengths and len(v) != lengths[k]]
        if wrong:
            print(f"mamba-tune: seed config dropped (does not fit this kernel: {', '.join(wrong)} of another "
                  f"length): {dict(seed.config)}", file=sys.stderr, flush=True)
        else:
            kept.append(seed)
    return kept


def _search(tk: TunableKernel, bound: Any, problem: Problem, budget: Budget, hb: _Heartbeat,
            seeds: list[Any], default: Any, log_base: str) -> tuple[Any, int | None]:
    """Helion's search on the bound kernel; it writes its autotune log to `log_base`.csv (and .log)."""
    from helion.autotuner import search_algorithms
    from helion.autotuner.effort_profile import get_effort_profile

    settings = bound.settings
    restore_compile_timeout(settings)
    if tk.default_config is not None:
        # Helion checks every candidate's outputs against a baseline, which it otherwise
        # gets by compiling its own default config in this process, with no time limit.
        settings.autotune_baseline_fn = bound.compile_config(default, allow_print=False)
    # Seeds join the first generation (Helion skips, with a log line, one that does not fit the
    # shape; one that does not fit the kernel was dropped by fitting_seeds).
    settings.autotune_seed_configs = seeds or None
    settings.autotune_random_seed = budget.seed
    settings.autotune_effort = budget.effort
    settings.autotune_budget_seconds = budget.seconds_per_combo
    settings.autotune_max_generations = budget.max_generations
    settings.autotune_progress_bar = False
    # Helion's own per-config log (search_trace.py reads it), set before the search reads the
    # settings; they are the kernel's, shared by every shape a warm worker tunes, so the previous
    # value comes back after. MAMBA_TUNE_SEARCH_LOG=0 leaves it alone (no trace in the entry).
    previous_log = settings.autotune_log
    if env.read(env.SEARCH_LOG) is not False:
        settings.autotune_log = log_base
    try:
        cls = search_algorithms[budget.algorithm]
        kwargs = cls.get_kwargs_from_profile(get_effort_profile(budget.effort), settings)
        search = cls(bound, problem.args, **kwargs)
        if tk.default_config is not None:
            _search_default(search, default)
        _budget_after_setup(search)
        if budget.seconds_per_combo is not None:
            _verification_within_budget(search, budget.seconds_per_combo)
        hb.search = search
        try:
            best = search.autotune(skip_cache=True)
        except helion.exc.NoConfigFound as e:
            start = getattr(search, "_autotune_budget_start", None)
            spent = None if start is None else time.perf_counter() - start
            log = read_helion_log(log_base + ".csv")
            dropped = log.dropped if log is not None else {}
            reason = no_config_reason(e, spent, budget.seconds_per_combo, dropped)
            if spent is not None and budget_ran_out(spent, budget.seconds_per_combo) and not dropped.get(ACCURACY_ERROR):
                raise BudgetRanOut(reason, spent) from None
            raise TuneFailure(reason) from None
    finally:
        settings.autotune_log = previous_log
    metrics = getattr(search, "_autotune_metrics", None)
    return best, getattr(metrics, "num_configs_tested", None)


def no_config_reason(e: Exception, spent: float | None, budget_s: int | None,
                     dropped: dict[str, int] | None = None) -> str:
    """The failure reason of a search that ended with Helion's NoConfigFound, from what its log
    says it dropped (`dropped`: configs by Helion's status).

    - Configs rejected by Helion's accuracy check: Helion compares each candidate's outputs and
      every argument the kernel writes, in full, with the default config's run. When every one
      differs, no budget helps: on the H200 all 14 seeds and 30 random configs of
      47B's first dB/dC pass differed where its S buffer is never written (it started as
      torch.empty; tests/tuner/test_tuning_written_args.py now checks every record for this). Say so.
    - Else, when the budget clock had run out, the likely cause is a budget shorter than the
      first generation's compiles: on the H200 the dB/dC backward's 19 seeds took over 12 s to
      compile at one group, so a 12 s search timed none of them. Say so, and what to change.
    """
    reason = f"autotune failed: {type(e).__name__}: {e}"
    dropped = dropped or {}
    drops = ", ".join(f"{n} {status}" for status, n in sorted(dropped.items()))
    if dropped.get(ACCURACY_ERROR):
        return (f"{reason}: Helion's accuracy check rejected {dropped[ACCURACY_ERROR]} of the configs it ran (dropped: {drops}): "
                f"each differed from the default config's run in an output or an argument the kernel writes; a "
                f"buffer the tuning problem leaves partly unwritten (torch.empty) differs so at every config")
    if spent is None or not budget_ran_out(spent, budget_s):
        return f"{reason} (dropped: {drops})" if drops else reason
    return (f"{reason}: the {budget_s} s search budget ran out ({spent:.1f} s) before any config was timed, "
            f"most likely while its first configs compiled; give it more time (--seconds-per-combo, or "
            f"budget.seconds_per_combo in the spec)" + (f" (dropped: {drops})" if drops else ""))


def budget_ran_out(spent: float, budget_s: int | None) -> bool:
    """Whether a search that ran `spent` seconds had used its whole budget."""
    return budget_s is not None and spent >= budget_s


# Each kernel's settings object -> the compile timeout it had before its first search here.
_FIRST_COMPILE_TIMEOUT: dict[int, Any] = {}


def restore_compile_timeout(settings: Any) -> None:
    """Start a search from the compile timeout the process began with. A bound kernel's settings
    are its kernel's, shared by every shape, and Helion's adaptive timeout lowers them during a
    search (to at most 30 s at quick effort): in a warm worker the next search of the same
    kernel would start from that, where a fresh worker starts from Helion's default (60 s)."""
    settings.autotune_compile_timeout = _FIRST_COMPILE_TIMEOUT.setdefault(id(settings),
                                                                          settings.autotune_compile_timeout)


def _search_default(search: Any, default: Any) -> None:
    """Make the kernel's own default the one Helion's search starts from.

    Helion 1.5.0 puts its default config in the first generation next to the seeds and
    compiles them together. At 47B's norm backward its default hit the 60 s compile timeout,
    which ran the whole 40 s budget out before any seed was timed (NoConfigFound). Private
    API: if Helion renames it, the search keeps Helion's default.
    """
    gen = getattr(search, "config_gen", None)
    if gen is None or not hasattr(gen, "default_flat"):
        return
    flat = gen.flatten(default)
    gen.default_flat = lambda: list(flat)


def _budget_after_setup(search: Any) -> None:
    """Make the spec's seconds_per_combo cap the search, not Helion's set-up.

    Helion 1.5.0 starts its budget clock in `_prepare`, before the benchmark provider
    compiles the baseline and starts its workers. On the H200 that set-up took about 47 s
    for the norm backward, so a 60 s budget left time for one config. Restart the clock
    once set-up is done (a private attribute: if Helion renames it, nothing changes).
    """
    prepare = getattr(search, "_prepare", None)
    if prepare is None or not hasattr(search, "_autotune_budget_start"):
        return

    def prepare_then_start_clock() -> None:
        prepare()
        search._autotune_budget_start = time.perf_counter()

    search._prepare = prepare_then_start_clock


# Helion's variable for how long its final verification times each finalist (its default 5 s).
FINAL_TARGET_ENV = "HELION_AUTOTUNE_FINAL_REBENCHMARK_TARGET_MS"
FINAL_TARGET_MS = (200.0, 5000.0)  # the least window that still times a 1 ms kernel 200 times; Helion's default


def _verification_within_budget(search: Any, budget_s: float) -> None:
    """Make Helion's final verification fit in what is left of the budget.

    After its search and polish rounds (which stop at the budget), Helion 1.5.0 re-times its 8
    best configs for 5 s each, whatever the budget: on an H100, 75 s searches at Nano TP1 ran
    126 s (the chunk scan: 58 s of it in that verification) and 131 s (the state-passing
    backward: 56 s). Each finalist's window becomes what is left over the finalists' count,
    between 0.2 and 5 s (Helion skips the verification once the budget has run out). The tuner
    still times the winner against the default config afterwards. A window set in the
    environment is left as it is.
    """
    final = getattr(search, "final_rebenchmark_best", None)
    top_k = getattr(search, "_final_rebenchmark_top_k", None)
    if final is None or top_k is None or not hasattr(search, "_autotune_budget_start"):
        return

    def within_budget(best: Any) -> Any:
        if os.environ.get(FINAL_TARGET_ENV) is not None:
            return final(best)
        left_ms = (budget_s - (time.perf_counter() - search._autotune_budget_start)) * 1000.0
        lo, hi = FINAL_TARGET_MS
        os.environ[FINAL_TARGET_ENV] = repr(min(hi, max(lo, left_ms / max(1, top_k()))))
        try:
            return final(best)
        finally:
            del os.environ[FINAL_TARGET_ENV]

    search.final_rebenchmark_best = within_budget


def adopt_problem(adopt: dict[str, Any], fits: str | None, fingerprint: str) -> str | None:
    """Why a sibling's entry is not adopted before it runs (None: check and time it): the submitter
    found it stale (`refused`), it was tuned in another config space than this bound call's, or
    Helion rejects its config here (`fits`: `lowering.config_problem_at`)."""
    if adopt.get("refused"):
        return str(adopt["refused"])
    recorded = adopt.get("config_spec_fingerprint")
    if recorded is not None and recorded != fingerprint:
        return f"tuned in another config space (fingerprint {str(recorded)[:12]} != {fingerprint[:12]} here)"
    return None if fits is None else f"its config does not fit this kernel here: {fits}"


def not_adopted(acc: Accuracy, ms: float | None = None, default_ms: float | None = None) -> str | None:
    """Why a sibling's config, checked (and timed) here, is not adopted (None: adopt it): it fails
    the numerics check, or it runs slower than the kernel's default config. Either way the combo
    gets the search it would have had without --adopt-sibling."""
    if not acc.passed:
        return accuracy_reason(acc)
    if ms is not None and default_ms is not None and default_ms < ms:
        return f"it runs in {ms:.4f} ms here, slower than the default config's {default_ms:.4f} ms"
    return None


def tune(
    kernel_name: str,
    dims: dict[str, int],
    dtype_name: str,
    budget: Budget,
    tol: Tolerance,
    *,
    status_path: str | None = None,
    warm_start: Sequence[dict[str, Any]] | None = None,
    adopt: dict[str, Any] | None = None,
) -> Outcome:
    """Tune one combo. `adopt` (`sweep --adopt-sibling`: {"from": sibling SKU, "config",
    "config_spec_fingerprint"} or {"from", "refused": why}) replaces the search with a sibling's
    config: it is checked and timed as a search winner is, and the entry records `adopted_from`;
    one that cannot be used (`adopt_problem`, `not_adopted`) falls back to the search, with a line."""
    phases: dict[str, float] = {}
    phase_start = time.perf_counter()

    def phase_done(name: str) -> None:
        nonlocal phase_start
        t = time.perf_counter()
        phases[name] = round(phases.get(name, 0.0) + t - phase_start, 2)  # a refused adoption's, then the search's
        phase_start = t

    tk = get(kernel_name)
    dtype = torch_dtype(dtype_name)
    interpret = ref_mode(tk)
    device = torch.device("cpu" if interpret else "cuda")
    if not interpret and not torch.cuda.is_available():
        raise TuneFailure("no CUDA GPU visible to the worker")
    problem = tk.make_problem(dims, dtype, device, budget.seed)
    bound = tk.kernel.bind(problem.args)
    default = tk.default_for(bound, dims)
    # The config space is the bound call's: a kernel's packed and unpacked calls (other loads)
    # have different ones, so it is recorded per entry, not per kernel. Ref mode binds another
    # space than compiled mode: a dry run records the compiled one, which `validate` binds.
    fingerprint = (config_spec(tk, dims, dtype_name) if interpret else bound.config_spec).structural_fingerprint_hash()
    prov = KernelProvenance(source_sha256=tk.source_sha256())

    def failure(reason: str) -> Outcome:
        return Outcome(None, Failure(kernel=kernel_name, dims=dims, dtype=dtype_name, reason=reason, at=now()), prov,
                       tuple(phases.items()))

    def compiled(cfg: Any) -> Callable[..., Any]:
        return tk.kernel if interpret else bound.compile_config(cfg, allow_print=False)

    adopting = False
    if adopt is not None:
        fits = None if adopt.get("refused") else config_problem_at(tk, adopt["config"], dims, dtype_name)
        adopting = not _fall_back(adopt, adopt_problem(adopt, fits, fingerprint))
    phase_done("setup")

    with _Heartbeat(status_path) as hb:
        search_log: SearchLog | None = None
        while True:  # twice at most: an adoption refused after its check or timing, then the search
            if adopting:
                best, tried, seeds = helion.Config.from_dict(adopt["config"]), 1, []  # type: ignore[index]
            elif interpret or budget.effort == "none":
                # No search: ref mode has no compiled code to time; effort none means "default".
                best, tried, seeds = default, 1, []
            else:
                hb.phase = "searching"
                try:
                    best, tried, seeds, search_log, budget = _search_with_retry(tk, dims, bound, problem, budget,
                                                                                hb, default, warm_start)
                except TuneFailure as e:  # a search that timed nothing, with its reason
                    return failure(str(e))
                except Exception as e:  # a search that finds nothing usable
                    if isinstance(e, helion.exc.TritonUnrecoverableRuntimeError):
                        raise ContextLost(f"autotune failed: {type(e).__name__}: {e}") from None
                    return failure(f"autotune failed: {type(e).__name__}: {e}")
            phase_done("search")

            hb.phase = "checking"
            # Check the winner on fresh inputs (another seed), not the ones it was tuned on.
            check = tk.make_problem(dims, dtype, device, budget.seed + 1)
            try:
                fn_best = compiled(best)
                got = check.run(fn_best)  # Triton compiles at the first launch
            except Exception as e:
                if not adopting or isinstance(e, helion.exc.TritonUnrecoverableRuntimeError):
                    raise
                phase_done("check")
                adopting = not _fall_back(adopt, f"it does not compile or run here: {type(e).__name__}: "  # type: ignore[arg-type]
                                                 f"{(str(e).strip().splitlines() or [''])[0]}")
                continue
            fn_default = compiled(default)
            acc = check_accuracy(check, got, tol)
            config = best
            if adopting and _fall_back(adopt, not_adopted(acc)):  # type: ignore[arg-type]
                adopting = False
                phase_done("check")
                continue
            if not acc.passed:
                acc_default = check_accuracy(check, check.run(fn_default), tol)
                phase_done("check")
                if acc_default.passed:
                    return failure(accuracy_reason(acc) + "; the default config passes: the search winner is rejected")
                return failure(accuracy_reason(acc) + "; the default config fails too: the kernel is wrong at this shape")

            phase_done("check")
            hb.phase = "timing"
            t_best = bench_ms(lambda f=fn_best: problem.run(f), device)
            # The same config timed twice would only report noise as a speedup (in ref mode every
            # config runs the same code: an adopted one too).
            t_default = t_best if best == default or interpret else bench_ms(lambda f=fn_default: problem.run(f), device)
            if adopting and _fall_back(adopt, not_adopted(acc, t_best, t_default)):  # type: ignore[arg-type]
                adopting = False
                phase_done("timing")
                continue
            if t_default < t_best:
                # The search measured the kernel alone; the full op (with epilogue) says default wins.
                config, t_best = default, t_default
            phase_done("timing")
            break
        baseline_ms = baseline_name = None
        if tk.make_baseline is not None:
            # The baseline only informs the entry: a baseline that fails to build or run (a
            # library's other version) costs its figure, not the checked winner.
            try:
                base = tk.make_baseline(dims, dtype, device, budget.seed)
                if base is not None:
                    baseline_ms, baseline_name = bench_ms(base.fn, device), base.name
            except Exception as e:  # noqa: BLE001 - any library error; said in one line, entry kept
                print(f"mamba-tune: {kernel_name}: baseline failed, entry kept without it: {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr, flush=True)
        phase_done("baseline")
        gbps = problem.bytes_moved / (t_best * 1e-3) / 1e9 if problem.bytes_moved else None
        tflops = problem.flops / (t_best * 1e-3) / 1e12 if problem.flops else None

    searched = not (interpret or budget.effort == "none" or adopting)
    entry = Entry(
        kernel=kernel_name,
        dims=dims,
        dtype=dtype_name,
        config=json.loads(config.to_json()),
        timing=Timing(tuned_ms=t_best, default_ms=t_default, baseline_ms=baseline_ms, baseline=baseline_name,
                      gbps=gbps, tflops=tflops),
        speedup=Speedup(vs_default=t_default / t_best,
                        vs_baseline=None if baseline_ms is None else baseline_ms / t_best),
        search=Search(algorithm=budget.algorithm if searched else "none",
                      effort="none" if interpret or adopting else budget.effort, configs_tried=tried,
                      seconds=phases["search"], seed=budget.seed, seed_configs=len(seeds),
                      budget_seconds=None if adopting else budget.seconds_per_combo,
                      max_generations=None if adopting else budget.max_generations,
                      trace=None if search_log is None else [list(p) for p in search_log.trace],
                      config_spec_fingerprint=fingerprint,
                      adopted_from=adopt["from"] if adopting else None),  # type: ignore[index]
        accuracy=acc,
        tuned_at=now(),
    )
    return Outcome(entry, None, prov, tuple(phases.items()))


def _fall_back(adopt: dict[str, Any], why: str | None) -> bool:
    """Say why the sibling's config is not adopted, and that the combo is searched (True), where
    there is a why."""
    if why is not None:
        print(f"mamba-tune: not adopting the {adopt['from']} entry's config ({why}); searching as without "
              "--adopt-sibling", file=sys.stderr, flush=True)
    return why is not None


def _search_with_retry(tk: TunableKernel, dims: dict[str, int], bound: Any, problem: Problem, budget: Budget,
                       hb: _Heartbeat, default: Any, warm_start: Sequence[dict[str, Any]] | None
                       ) -> tuple[Any, int | None, list[Any], SearchLog | None, Budget]:
    """The search, retried once when its budget ran out before it timed a config: (winner, configs
    tried, seeds, Helion's log, the budget it ran with). TuneFailure: it found nothing usable."""
    seeds = fitting_seeds(seed_configs(tk, dims, warm_start), default)
    with tempfile.TemporaryDirectory(prefix="mamba-tune-search-") as tmp:
        log_base = os.path.join(tmp, "search")
        try:
            best, tried = _search(tk, bound, problem, budget, hb, seeds, default, log_base)
        except BudgetRanOut as e:
            # Once: the budget went on compiles, which the retry finds cached.
            first = budget.seconds_per_combo
            budget = retry_budget(budget, e.spent)
            print(f"{e}; retrying once with a {budget.seconds_per_combo} s budget (its first configs "
                  "are compiled now)", file=sys.stderr, flush=True)
            log_base = os.path.join(tmp, "retry")
            try:
                best, tried = _search(tk, bound, problem, budget, hb, seeds, default, log_base)
            except BudgetRanOut as again:
                raise TuneFailure(f"{again} (in a retry, after the {first} s search timed nothing in "
                                  f"{e.spent:.1f} s)") from None
        search_log = read_helion_log(log_base + ".csv")
    if search_log is not None:
        print(f"search log: {describe_search_log(search_log)}", file=sys.stderr, flush=True)
    return best, tried, seeds, search_log, budget
