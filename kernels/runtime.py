"""Run-time config selection: load bundles once, never search.

For each (kernel, shape) the first call resolves a config, compiles it once with
`BoundKernel.compile_config` and caches the compiled callable; later calls with the
same shapes, strides and dtypes only pay a dict lookup. Which config a key gets (the
lookup modes, the GPU SKU's bundles before its siblings', the nearest rule, a GPU with no
bundle) is `mamba_tune.store`'s to say (docs/bundles.md). A bundle's config that the
kernel's config space does not allow (`mamba_tune.config_schema.checked_config`), or that
fails to compile or launch at its first call, gives one warning naming the entry and its
bundle, and that key runs the kernel's default config from then on: a bad config never
stops a training call. Autotuning is impossible on this path: every runtime kernel is
declared with ``autotuner_fn=refuse_autotune``.

Each kernel file declares its `RuntimeKernel` next to its code: its key (`mamba_tune.keys`:
name, dims, source), the key dims read from the call's arguments and the default config. There is no list of all
kernels here: a kernel's entries are indexed, and checked against its source hash, the
first time that kernel is resolved.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mamba_tune import env, vocab
from mamba_tune.config_schema import checked_config
from mamba_tune.keys import KernelKey
from mamba_tune.sku import Gpu
from mamba_tune.store import ENV_CONFIGS as ENV_CONFIGS
from mamba_tune.store import NEAREST_MAX_RATIO as NEAREST_MAX_RATIO
from mamba_tune.store import ConfigStore, Mode, Resolution, default_bundle_paths
from mamba_tune.store import nearest_entry as nearest_entry

log = logging.getLogger("mamba_tune")

ENV_MODE = env.CONFIG_MODE


class MambaTuneWarning(UserWarning):
    """A config could not be used as tuned; the kernel runs with a fallback."""


class RuntimeAutotuneError(RuntimeError):
    pass


def refuse_autotune(bound_kernel: Any, args: Sequence[object], **kwargs: object) -> Any:
    """Helion `autotuner_fn` for every runtime kernel: searching at run time is a bug."""
    raise RuntimeAutotuneError(
        f"{getattr(bound_kernel.kernel, 'name', 'kernel')}: autotuning is disabled at run time; "
        "tune offline with `mamba-tune sweep` or `mamba-tune tune`"
    )


@dataclasses.dataclass(frozen=True)
class RuntimeKernel:
    """What the runtime needs to know of one Helion kernel to pick and compile its config."""

    # The bundle key: name, family, dims, size and neutral dims, source (mamba_tune.keys).
    key: KernelKey
    kernel: Any  # helion.Kernel: the key's source function
    # Key dims from the kernel's own arguments (what the runtime sees).
    dims_from_args: Callable[[Sequence[Any]], dict[str, int]]
    # The kernel's default config at these dims (a config dict, which may leave keys out),
    # where Helion's own default is impractical: what a shape with no tuned entry runs, the
    # search's accuracy baseline, and what `speedup.vs_default` compares against. None:
    # Helion's default. (Helion's default for the norm backward at a 2048-wide group puts
    # 16 whole rows in one program's registers; Triton spent minutes compiling it.)
    default_config: Callable[[dict[str, int]], dict[str, Any]] | None = None
    # The argument whose dtype names the bundle key's dtype (None: the first tensor). A
    # kernel whose first tensor is an fp32 buffer names the model's input dtype instead,
    # as its tuning records do (the key of a bf16 model's call says bf16).
    dtype_arg: int | None = None

    def __post_init__(self) -> None:
        fn = getattr(self.kernel, "fn", self.kernel)
        where = Path(fn.__code__.co_filename).resolve()
        if (fn.__name__, where) != (self.key.function, self.key.source_path()):
            raise ValueError(f"{self.key.name}: kernel {fn.__name__} in {where} is not its key's source "
                             f"{self.key.source} ({self.key.source_path()})")

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def family(self) -> str:
        return self.key.family

    @property
    def dims(self) -> tuple[str, ...]:
        return self.key.dims

    @property
    def size_dims(self) -> tuple[str, ...]:
        return self.key.size_dims

    @property
    def neutral_dims(self) -> tuple[str, ...]:
        return self.key.neutral_dims

    def source_sha256(self) -> str:
        """What a bundle's provenance records: a changed kernel invalidates its entries."""
        return self.key.source_sha256()

    def default_for(self, bound: Any, dims: dict[str, int]) -> Any:
        """The default config (a helion.Config) for a kernel bound to arguments with these dims."""
        import helion
        from helion.runtime.settings import RefMode

        if self.default_config is None or self.kernel.settings.ref_mode != RefMode.OFF:
            # (In Helion ref mode no config applies, and the config spec is empty.)
            return bound.config_spec.default_config()

        config = helion.Config.from_dict(self.default_config(dims))
        bound.config_spec.normalize(config)
        return config


def tune_command(rk: RuntimeKernel, dims: dict[str, int], dtype: str) -> str:
    dims_text = ",".join(f"{k}={v}" for k, v in dims.items())
    return f"mamba-tune tune {rk.name} --dims {dims_text} --dtype {dtype}"


class _Runtime:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.paths: list[Path] | None = None
        self.mode: Mode | None = None
        self.stores: dict[Gpu | None, ConfigStore] = {}
        self.gpus: dict[torch.device, Gpu | None] = {}  # read_gpu's answer per device, read once
        self.compiled: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self.resolutions: dict[tuple[Any, ...], Resolution] = {}
        self.warned: set[str] = set()

    def warn_once(self, message: str) -> None:
        if message not in self.warned:
            self.warned.add(message)
            warnings.warn(message, MambaTuneWarning, stacklevel=4)

    def log_once(self, message: str) -> None:
        if message not in self.warned:
            self.warned.add(message)
            log.warning("%s", message)

    def effective_mode(self) -> Mode:
        forced = env.read(ENV_MODE)
        if forced is not None:
            return Mode(forced)
        return self.mode or Mode.nearest

    def store(self, gpu: Gpu | None) -> ConfigStore:
        store = self.stores.get(gpu)
        if store is None:
            paths = self.paths if self.paths is not None else default_bundle_paths()
            store = ConfigStore(paths, gpu, self.warn_once)
            self.stores[gpu] = store
        return store


_RT = _Runtime()


def current_mode() -> Mode:
    """The lookup mode in force: its variable (env.CONFIG_MODE), else `configure(mode=...)`, else nearest."""
    return _RT.effective_mode()


def configure(*, bundle_paths: Sequence[str | os.PathLike[str]] | None = None, mode: Mode | str | None = None) -> None:
    """Choose where bundles come from and the lookup mode; drops every cached config."""
    with _RT.lock:
        _RT.paths = None if bundle_paths is None else [Path(p) for p in bundle_paths]
        _RT.mode = None if mode is None else Mode(mode)
        _RT.stores.clear()
        _RT.gpus.clear()
        _RT.compiled.clear()
        _RT.resolutions.clear()
        _RT.warned.clear()
    if _RECORDER is not None:
        _RECORDER.forget_resolutions()


def _signature(args: Sequence[Any]) -> tuple[Any, ...]:
    # Helion's static shapes bake sizes and strides into the code: key on all of them. This
    # runs on every call, so it is a flat loop with a bound append (a generator of tuples
    # costs twice as much). The device is left out: a compiled Helion callable allocates
    # its outputs on its inputs' device and Triton compiles per device on first launch.
    # A contiguous tensor's strides follow from its shape (up to size-1 dims, whose index
    # is always 0 in the generated code), so only other tensors pay for stride(): that is
    # 1.2x faster on the dev CPU. Each tensor adds exactly three items, so keys cannot alias.
    sig: list[Any] = []
    add = sig.append
    for a in args:
        if isinstance(a, _Tensor):
            add(a.shape)
            add(a.dtype)
            add(None if a.is_contiguous() else a.stride())
        else:
            add(a)
    return tuple(sig)


_Tensor = torch.Tensor


def read_gpu(device: torch.device) -> Gpu | None:
    """The one place the runtime asks which GPU it runs on: name and compute capability, None
    off CUDA. `gpu_of` calls it once per device, at a shape's first call (never on the cached
    path, so CUDA-graph capture never meets it); a test without a GPU patches this function."""
    if device.type != "cuda":
        return None
    return Gpu.of(torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))


def gpu_of(args: Sequence[Any]) -> Gpu | None:
    """The GPU a call runs on (its first CUDA tensor's, else its first tensor's device), read once per device."""
    device: torch.device | None = None
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.device.type == "cuda":
                device = a.device
                break
            device = device or a.device
    if device is None:
        return None
    if device not in _RT.gpus:
        _RT.gpus[device] = read_gpu(device)
    return _RT.gpus[device]


def _dtype_of(args: Sequence[Any], index: int | None = None) -> str:
    if index is not None and isinstance(args[index], torch.Tensor):
        return vocab.dtype_name(args[index].dtype)
    for a in args:
        if isinstance(a, torch.Tensor):
            return vocab.dtype_name(a.dtype)
    raise ValueError("kernel call without tensor arguments")


def resolve(rk: RuntimeKernel, args: Sequence[Any]) -> Resolution:
    """Which config a call with these arguments runs (no compilation)."""
    dims = rk.dims_from_args(args)
    dtype = _dtype_of(args, rk.dtype_arg)
    return _RT.store(gpu_of(args)).resolve(rk, dims, dtype, _RT.effective_mode())


class NoDeviceError(RuntimeError):
    """A kernel call on tensors that no compiled Helion kernel runs on (CPU, meta)."""


def _check_device(rk: RuntimeKernel, args: Sequence[Any]) -> None:
    devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
    if devices & {"cpu", "meta"}:
        where = ", ".join(sorted(devices))
        raise NoDeviceError(
            f"{rk.name}: tensors on {where}: the kernels run compiled on a CUDA GPU; without one, set "
            "HELION_INTERPRET=1 before importing mamba_tune to run them in Helion's ref mode (eager PyTorch, "
            "for testing; tuned configs do not apply)"
        )


def _ref_mode_call(rk: RuntimeKernel) -> Callable[..., Any]:
    """The kernel in Helion ref mode, leaving the process as it found it when a call fails."""
    from mamba_tune.ref_mode import leave_ref_mode_context, ref_mode_context

    def call(*args: Any) -> Any:
        before = ref_mode_context()
        try:
            return rk.kernel(*args)
        except BaseException:
            try:
                leave_ref_mode_context(before)
            except Exception:  # never hide the call's own error
                log.exception("%s: could not leave Helion's ref-mode context after a failed call", rk.name)
            raise

    return call


def _prepare(rk: RuntimeKernel, args: Sequence[Any], sig: tuple[Any, ...]) -> Callable[..., Any]:
    from helion.runtime.settings import RefMode

    if rk.kernel.settings.ref_mode != RefMode.OFF:
        # Helion ref mode (HELION_INTERPRET=1): the body runs eagerly; configs do not apply.
        _RT.log_once("mamba-tune: Helion ref mode (HELION_INTERPRET=1): the kernels run eagerly in PyTorch "
                     "(for testing); tuned configs from bundles do not apply")
        fn: Callable[..., Any] = _ref_mode_call(rk)
    else:
        _check_device(rk, args)
        res = resolve(rk, args)
        dims = rk.dims_from_args(args)
        if res.config is None:
            cmd = tune_command(rk, dims, _dtype_of(args, rk.dtype_arg))
            # A GPU no bundle was tuned for: one warning for the process, not one per key.
            _RT.warn_once(_RT.store(gpu_of(args)).no_bundle_warning() or
                          f"mamba-tune: no tuned config for {res.key}; running the kernel's default config. "
                          f"Tune it with: {cmd}")
        elif res.sibling:
            _RT.log_once(f"mamba-tune: this {res.running_on} runs configs tuned on {res.tuned_on} (same compute "
                         f"capability) where its own bundles have no entry; INFO logs each such key "
                         f"'({res.sku_note})'. Tune for {res.running_on} on this GPU: `mamba-tune sweep "
                         f"sweeps/<spec>.yaml` with the spec's `target: {{gpu: {res.running_on}}}`")
        log.info("%s: %s", res.key, res.source)
        bound = rk.kernel.bind(tuple(args))
        fn, res = _compile(rk, bound, res, dims, _dtype_of(args, rk.dtype_arg))
        _RT.resolutions[(rk.name, sig)] = res
        if res.config is not None:
            fn = _first_launch_guard(rk, bound, res, dims, _dtype_of(args, rk.dtype_arg), (rk.name, sig), fn)
    _RT.compiled[(rk.name, sig)] = fn
    return fn


def _compile(rk: RuntimeKernel, bound: Any, res: Resolution, dims: dict[str, int],
             dtype: str) -> tuple[Callable[..., Any], Resolution]:
    """The bound kernel compiled with the resolved config, or with the kernel's default
    config (one warning) when Helion rejects the bundle's: a bad bundle never stops training."""
    if res.config is not None:
        try:
            return bound.compile_config(_to_config(res.config, bound), allow_print=False), res
        except Exception as e:  # ConfigError, InvalidConfig, or a config the code generator refuses
            text = str(e).strip()
            why = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
            _RT.warn_once(f"mamba-tune: Helion rejects the config for {res.key} ({res.source}): {why}; running the "
                          f"kernel's default config. Re-tune it with: {tune_command(rk, dims, dtype)}")
            res = Resolution(None, f"default (config rejected: {res.source})", res.key)
    return bound.compile_config(rk.default_for(bound, dims), allow_print=False), res


def _to_config(config: dict[str, Any], bound: Any) -> Any:
    """A bundle's config checked against this bound kernel's config space (ConfigError or InvalidConfig if it
    does not fit)."""
    return checked_config(config, bound.config_spec)


def _first_launch_guard(rk: RuntimeKernel, bound: Any, res: Resolution, dims: dict[str, int], dtype: str,
                        k: tuple[Any, ...], fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (a bundle config compiled by Helion) for its first call: Triton compiles it at its
    first launch, so a config that Triton refuses (or that cannot launch) fails there, not in
    `_compile`. Then one warning names the entry and its bundle, and the default config
    runs this call and, in the cache, every later one. After a first call that works, the
    cache holds `fn` itself: the hot path stays as it was, without a check or a sync."""

    def first_call(*args: Any, **kwargs: Any) -> Any:
        try:
            out = fn(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise  # the inputs' or outputs' memory, not the config: another call may fit
        except Exception as e:
            text = str(e).strip()
            why = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
            _RT.warn_once(f"mamba-tune: the config for {res.key} ({res.source}) failed to compile or launch: "
                          f"{why}; running the kernel's default config. Re-tune it with: "
                          f"{tune_command(rk, dims, dtype)}")
            default = bound.compile_config(rk.default_for(bound, dims), allow_print=False)
            with _RT.lock:
                if _RT.compiled.get(k) is first_call:  # not dropped by configure() meanwhile
                    _RT.compiled[k] = default
                    _RT.resolutions[k] = Resolution(None, f"default (config failed to compile: {res.source})",
                                                    res.key)
            return default(*args, **kwargs)
        with _RT.lock:
            if _RT.compiled.get(k) is first_call:
                _RT.compiled[k] = fn
        return out

    return first_call


def lookup(rk: RuntimeKernel, args: Sequence[Any]) -> Callable[..., Any]:
    """The compiled callable for these arguments (compiled on the first call only)."""
    k = (rk.name, _signature(args))
    fn = _RT.compiled.get(k)
    if fn is None:
        with _RT.lock:
            fn = _RT.compiled.get(k) or _prepare(rk, args, k[1])
    if _RECORDER is not None:
        _RECORDER.count(rk, args, k)
    return fn


# --- recording (kernels/record.py): the one check `lookup` pays when it is off ----------

_RECORDER: Any = None  # a mamba_tune.record.Recorder while recording


def recorder() -> Any:
    """The active mamba_tune.record.Recorder, or None."""
    return _RECORDER


def set_recorder(rec: Any) -> None:
    global _RECORDER
    _RECORDER = rec


def resolution_of(k: tuple[Any, ...]) -> Resolution | None:
    """The resolution a compiled (kernel name, signature) ran with, if it was resolved."""
    return _RT.resolutions.get(k)


def dtype_of(args: Sequence[Any], rk: RuntimeKernel | None = None) -> str:
    """The dtype name of a call, as in entry keys (the kernel's `dtype_arg`, else the first tensor's)."""
    return _dtype_of(args, None if rk is None else rk.dtype_arg)


def run(rk: RuntimeKernel, args: Sequence[Any]) -> Any:
    """Run a tunable kernel with its tuned config. Never searches, never syncs."""
    return lookup(rk, args)(*args)


def resolutions() -> dict[str, str]:
    """Key -> source for every shape compiled so far (for logs and `mamba-tune bench`)."""
    return {r.key: r.source for r in _RT.resolutions.values()}
