"""One switch: run transformers' Mamba-2 mixers on these kernels.

`patch_transformers()` makes the Mamba-2 mixers of transformers' `Mamba2`, `NemotronH`,
`Zamba2` and `FalconH1` models call mamba-tune's functions (tested with transformers
5.24.0 in CI, and by hand with 5.0.0, 5.6.0, 5.12.1, 5.14.1, 5.15.0, 5.18.0 and 5.21.1).
transformers 5.15 to 5.24 define, in each model's modeling module, five module-level
functions that the mixer's one `forward` calls by name at call time:

| transformers' name | mamba-tune's function |
|---|---|
| `mamba2_chunk_scan` | `mamba_chunk_scan_combined` |
| `mamba2_split_conv1d_scan_combined` | `mamba_split_conv1d_scan_combined` (training, no cache) |
| `causal_conv1d_fn` | `causal_conv1d_fn` |
| `causal_conv1d_update` | `causal_conv1d_update` (decoding) |
| `mamba2_selective_state_update` | `selective_state_update` (decoding) |

and the mixer's gated norm, a `*RMSNormGated` module of the modeling module, whose
`forward` becomes `rmsnorm_fn` (same eps, group size and gate order as the module's own).
transformers decorates each function with `use_kernel_func_from_hub_with_fallback`, which
picked, when the module was imported, mamba-ssm's / causal-conv1d's function if that
package imports, else its own PyTorch code; no check on the device type is left (5.15
removed `is_fast_path_available`, the `"cuda" in device.type` gate and
`cuda_kernels_forward`). The patch replaces those module attributes, so mixers built
before it run the kernels too, on any device: on CPU the kernels raise
`mamba_tune.runtime.NoDeviceError` unless `HELION_INTERPRET=1` (Helion's ref mode).

A function is wired when `mamba_tune` has it (looked up by name on the package, so
kernels added later are wired without a change here). One it does not have yet is never
replaced silently: while patched, its first call warns (`MambaTuneWarning`, naming it and
saying what runs instead) and then runs transformers' own (mamba-ssm's, causal-conv1d's or
PyTorch, whatever transformers picked); for `mamba_split_conv1d_scan_combined` "instead"
is the mixer's unfused path, which transformers takes when the fused function returns
None: conv1d, mamba-tune's `mamba_chunk_scan_combined`, the gated norm, `out_proj`. With
`strict=True` such a call raises `NotImplementedError` instead.

transformers 5.0 to 5.14 have another structure: each mixer's `__init__` looks the
functions up (`lazy_load_kernel("mamba-ssm")`, `("causal-conv1d")`; in 5.0 Zamba2 and FalconH1
import them at module import) into module globals under mamba-ssm's names
(`mamba_chunk_scan_combined`, `mamba_split_conv1d_scan_combined`, `causal_conv1d_fn`,
`causal_conv1d_update`, `selective_state_update`), and `forward` takes
`cuda_kernels_forward` only when all five were found (`is_fast_path_available`) and the
weights are on CUDA, else `torch_forward`. There the patch sets those globals (ours, or
transformers' own behind the same notice), wraps the mixer's `__init__` so that a mixer
built later re-installs them after its lookup, and sets `is_fast_path_available` when each
of the five has something to run. When one has neither (mamba-tune lacks it and
transformers found no package for it) the mixers keep their PyTorch path: that warns,
naming them, and strict raises. The kernel path still needs CUDA weights there (on CPU
call `mixer.cuda_kernels_forward` directly, as the tests do). Versions after 5.24 are
patched when their modules have the same structure (with a warning that they are
untested) and refused otherwise; 4.x is refused.

`unpatch_transformers()` puts back exactly the objects it replaced; both are idempotent.
`MAMBA_TUNE_PATCH_TRANSFORMERS=1` (or `strict`) patches at `import mamba_tune`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

from mamba_tune import env
from mamba_tune.patch import _State, patched_block
from mamba_tune.runtime import MambaTuneWarning

ENV_PATCH = env.PATCH_TRANSFORMERS
# Oldest version with module-level functions (older ones: "legacy" below); newest one tested.
MIN_VERSION = "5.15.0"
TESTED_VERSION = "5.24.0"

# transformers' module-level function -> mamba-tune's function of the same semantics
# (mamba-ssm's / causal-conv1d's signature, which transformers' call sites follow).
FUNCTIONS: dict[str, str] = {
    "mamba2_chunk_scan": "mamba_chunk_scan_combined",
    "mamba2_split_conv1d_scan_combined": "mamba_split_conv1d_scan_combined",
    "causal_conv1d_fn": "causal_conv1d_fn",
    "causal_conv1d_update": "causal_conv1d_update",
    "mamba2_selective_state_update": "selective_state_update",
}
# transformers 5.0 to 5.14: the module globals the mixers' cuda_kernels_forward calls (set
# by the mixer's __init__ through lazy_load_kernel, or at import), under mamba-ssm's names.
LEGACY_MIN_VERSION = "5.0.0"
LEGACY_FUNCTIONS: dict[str, str] = {name: name for name in FUNCTIONS.values()}
FAST_PATH_FLAG = "is_fast_path_available"
NORM_FUNCTION = "rmsnorm_fn"
# What each function runs for, in the warning of one that is not provided.
_USE = {
    "mamba_chunk_scan_combined": "the chunked scan of a prefill or training forward",
    "mamba_split_conv1d_scan_combined": "the fused conv1d + scan + norm + out_proj of a training forward",
    "causal_conv1d_fn": "the depthwise causal conv1d of a prefill or training forward",
    "causal_conv1d_update": "the conv1d of one decoding step",
    "selective_state_update": "the state update of one decoding step",
    "rmsnorm_fn": "the mixer's gated RMSNorm",
}
# The fused function returns None to make the mixer take its unfused path (transformers'
# own contract: its PyTorch stand-in returns None).
_FUSED = "mamba2_split_conv1d_scan_combined"


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """One transformers model whose Mamba-2 mixer is patched."""

    model_type: str  # the config's model_type, and the folder under transformers.models
    mixer: str  # the mixer class of the modeling module

    @property
    def module(self) -> str:
        return f"transformers.models.{self.model_type}.modeling_{self.model_type}"


FAMILIES = (
    ModelFamily("mamba2", "Mamba2Mixer"),
    ModelFamily("nemotron_h", "NemotronHMamba2Mixer"),
    ModelFamily("zamba2", "Zamba2MambaMixer"),
    ModelFamily("falcon_h1", "FalconH1Mixer"),
)


class TransformersNotInstalledError(ImportError):
    """patch_transformers() was called where transformers cannot be imported."""


class UnsupportedTransformersError(RuntimeError):
    """The installed transformers' Mamba-2 modules do not have the structure patched here."""


# (owner, attribute) keys; an original of _ABSENT: not there (inherited, or, 5.0-5.14, not
# set yet by a mixer's __init__).
_STATE = _State()
_ABSENT = object()


def is_transformers_patched() -> bool:
    """Whether transformers' Mamba-2 mixers currently call these kernels."""
    return bool(_STATE.installed)


def provided(name: str) -> Callable[..., Any] | None:
    """mamba-tune's function `name` (e.g. "causal_conv1d_fn"), or None where it has none yet."""
    # The package's public names (its lazy table); no import: a submodule's package is loaded first.
    package = sys.modules[__package__]
    try:
        value = getattr(package, name)
    except AttributeError:
        return None
    return value if callable(value) else None  # a submodule of that name is not the function


def not_provided() -> list[str]:
    """The functions the patched mixers may call that mamba-tune does not have yet."""
    return [name for name in [*FUNCTIONS.values(), NORM_FUNCTION] if provided(name) is None]


# --- transformers: version and structure -----------------------------------------------


def _version_tuple(version: str) -> tuple[int, ...]:
    from packaging.version import Version

    return Version(version).release


def _is_legacy(version: str) -> bool:
    return _version_tuple(version) < _version_tuple(MIN_VERSION)


def _functions(legacy: bool) -> dict[str, str]:
    return LEGACY_FUNCTIONS if legacy else FUNCTIONS


def _import_transformers() -> tuple[bool, list[tuple[ModelFamily, Any]]]:
    """Whether transformers is 5.0-5.14 (legacy), and the modeling module of each family it
    has; raises where unsupported."""
    if importlib.util.find_spec("transformers") is None:
        raise TransformersNotInstalledError(
            f"patch_transformers: transformers is not installed (pip install 'transformers>={MIN_VERSION}')")
    import transformers

    version = transformers.__version__
    if _version_tuple(version) < _version_tuple(LEGACY_MIN_VERSION):
        raise UnsupportedTransformersError(
            f"patch_transformers: transformers {version} is not supported (needs >= {LEGACY_MIN_VERSION}; tested "
            f"with {TESTED_VERSION})")
    legacy = _is_legacy(version)
    modules = []
    for family in FAMILIES:
        if legacy and importlib.util.find_spec(f"transformers.models.{family.model_type}") is None:
            continue  # e.g. NemotronH, which 5.0 does not have
        try:
            module = importlib.import_module(family.module)
        except ImportError as e:
            raise UnsupportedTransformersError(
                f"patch_transformers: transformers {version} has no {family.module} ({e})") from e
        mixer = getattr(module, family.mixer, None)
        # Legacy modules set the functions' globals in the mixer's __init__: check the mixer.
        needed = ("cuda_kernels_forward", "torch_forward") if legacy else FUNCTIONS
        missing = [name for name in needed if not hasattr(mixer if legacy else module, name)]
        if mixer is None or missing or not _norm_classes(module):
            what = family.mixer if mixer is None else ", ".join(missing) if missing else "a *RMSNormGated class"
            raise UnsupportedTransformersError(
                f"patch_transformers: transformers {version}'s {family.module} has no {what}; "
                f"the patch knows transformers {LEGACY_MIN_VERSION} to {TESTED_VERSION}")
        modules.append((family, module))
    if _version_tuple(version)[:2] > _version_tuple(TESTED_VERSION)[:2]:
        warnings.warn(f"patch_transformers: transformers {version} is newer than the tested {TESTED_VERSION}; its "
                      "Mamba-2 modules have the expected names, patching them", MambaTuneWarning, stacklevel=3)
    return legacy, modules


def _norm_classes(module: Any) -> list[type]:
    """The gated-norm classes a modeling module uses (defined there or imported, e.g. 5.15's
    NemotronH mixer builds zamba2's `Zamba2RMSNormGated`)."""
    return [obj for name, obj in vars(module).items()
            if name.endswith("RMSNormGated") and isinstance(obj, type) and issubclass(obj, torch.nn.Module)]


def _cells(function: Any) -> dict[str, Any]:
    """A function's closure by variable name ({} for anything else)."""
    code, closure = getattr(function, "__code__", None), getattr(function, "__closure__", None) or ()
    return dict(zip(code.co_freevars, (c.cell_contents for c in closure), strict=True)) if code else {}


def _inner(function: Any) -> Any:
    """transformers' decorated function itself. With Hugging Face's kernels package (a version
    transformers accepts: 0.17.2 with 5.15 to 5.2x here), the decorator turns it into a layer
    (an nn.Module whose forward calls it) that kernelize (use_kernels=True) can swap."""
    if isinstance(function, torch.nn.Module):
        inner = _cells(type(function).forward).get("func")
        if callable(inner):
            return inner
    return function


def _resolved(function: Any) -> str:
    """What transformers' decorated function runs: the implementation it picked at import."""
    layer = isinstance(function, torch.nn.Module)
    function = _inner(function)
    implementation = _cells(function).get("implementation")
    if implementation is None:  # not transformers' wrapper (some other patch's function)
        what = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', type(function).__name__)}"
    elif implementation is getattr(function, "__wrapped__", None):  # the decorated function itself
        what = "transformers' PyTorch code"
    else:
        what = f"{implementation.__module__}.{implementation.__qualname__}"
    return f"{what}, as a kernels layer" if layer else what


# --- the replacements ------------------------------------------------------------------


def _accepted(function: Callable[..., Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A filter of keyword arguments to those `function` takes, as transformers' own wrapper
    does (the mixers pass their forward's **kwargs down, e.g. attention kwargs)."""
    parameters = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return lambda kwargs: kwargs
    names = frozenset(parameters)
    return lambda kwargs: {k: v for k, v in kwargs.items() if k in names}


def _wraps(original: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """functools.wraps without copying `__dict__` (the original may be an nn.Module), and
    nothing to copy from where transformers found no function (legacy: None)."""
    if not callable(original):
        return lambda f: f
    return functools.wraps(original, updated=())


def _wired(tf_name: str, name: str, ours: Callable[..., Any], original: Any) -> Callable[..., Any]:
    accept = _accepted(ours)

    @_wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        return ours(*args, **accept(kwargs))

    call.mamba_tune_runs = f"mamba_tune.{name}"  # type: ignore[attr-defined]
    return call


def _notice(name: str, instead: str) -> None:
    """Raise if strict, else warn once per function per patch."""
    if _STATE.strict:
        raise NotImplementedError(f"mamba-tune has no {name} yet ({_USE[name]}); "
                                  f"patch_transformers(strict=True) does not run {instead}")
    if name not in _STATE.warned:
        _STATE.warned.add(name)
        warnings.warn(f"mamba-tune has no {name} yet ({_USE[name]}); this runs {instead}", MambaTuneWarning,
                      stacklevel=3)


def _missing(tf_name: str, name: str, original: Any) -> Callable[..., Any]:
    if tf_name == _FUSED:
        instead = ("the mixer's unfused path (conv1d, mamba-tune's mamba_chunk_scan_combined, the gated norm, "
                   "out_proj)")

        @_wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            _notice(name, instead)
            return None  # transformers' signal to take the unfused path
    else:
        instead = f"transformers' {tf_name} ({_resolved(original)})"

        @_wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            _notice(name, instead)
            return original(*args, **kwargs)

    call.mamba_tune_runs = instead  # type: ignore[attr-defined]
    return call


def _legacy_missing(module: Any, name: str) -> Callable[..., Any]:
    """5.0-5.14: the function transformers found (read at call time: each mixer's __init__
    looks it up again), behind the notice. The mixer's kernel path uses the fused call's
    result as is, so here it runs transformers' fused function too."""

    def call(*args: Any, **kwargs: Any) -> Any:
        original = _STATE.originals.get((module, name))
        if not callable(original):
            raise NotImplementedError(f"neither mamba-tune nor transformers has {name} "
                                      f"({module.__name__} found none)")
        _notice(name, f"transformers' {name} ({_resolved(original)})")
        return original(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.mamba_tune_legacy_of = module  # type: ignore[attr-defined]
    return call


def _norm_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """`forward(hidden_states, gate=None)` of transformers' gated RMSNorm modules on `rmsnorm_fn`.

    The modules differ by version and model: a `group_size` (5.2x), `n_groups` (FalconH1) or
    neither (the whole row: Mamba2 before 5.2x); the gate before the norm, or after it where
    `norm_before_gate` says so (FalconH1).
    """
    rmsnorm_fn = provided(NORM_FUNCTION)

    @_wraps(original)
    def forward(self: torch.nn.Module, hidden_states: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        if rmsnorm_fn is None:
            _notice(NORM_FUNCTION, f"transformers' {type(self).__name__}.forward")
            return original(self, hidden_states, gate)
        d = hidden_states.shape[-1]
        group_size = getattr(self, "group_size", None)
        if group_size is None and getattr(self, "n_groups", None):
            group_size = d // self.n_groups
        if gate is not None and gate.dtype != hidden_states.dtype:  # the module computes in fp32 anyway
            dtype = torch.promote_types(gate.dtype, hidden_states.dtype)
            hidden_states, gate = hidden_states.to(dtype), gate.to(dtype)
        return rmsnorm_fn(hidden_states, self.weight, None, z=gate, eps=self.variance_epsilon, group_size=group_size,
                          norm_before_gate=bool(getattr(self, "norm_before_gate", False)))

    forward.mamba_tune_runs = f"mamba_tune.{NORM_FUNCTION}"  # type: ignore[attr-defined]
    return forward


def _replacements(modules: list[tuple[ModelFamily, Any]], legacy: bool) -> dict[tuple[Any, str], Any]:
    """(owner, attribute) -> its replacement, for every family's module."""
    out: dict[tuple[Any, str], Any] = {}
    for family, module in modules:
        for tf_name, name in _functions(legacy).items():
            original = vars(module).get(tf_name)
            ours = provided(name)
            if ours is not None:
                out[(module, tf_name)] = _wired(tf_name, name, ours, original)
            else:
                out[(module, tf_name)] = (_legacy_missing(module, tf_name) if legacy
                                          else _missing(tf_name, name, original))
        for cls in _norm_classes(module):
            if (cls, "forward") not in out:  # a class imported by several modules: patched once
                out[(cls, "forward")] = _norm_forward(cls.forward)
        if legacy:
            mixer = getattr(module, family.mixer)
            out[(mixer, "__init__")] = _legacy_init(module, mixer.__init__)
    return out


# --- 5.0 to 5.14: globals that each mixer's __init__ sets, and the fast-path flag -------------


def _legacy_init(module: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """The mixer's __init__, then the patch's globals again (the original set transformers')."""

    @_wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        with _STATE.lock:
            if _STATE.installed:
                _legacy_install(module)

    __init__.mamba_tune_runs = "the mixer's __init__, then mamba-tune's globals"  # type: ignore[attr-defined]
    return __init__


def _legacy_install(module: Any, at_patch: bool = False) -> None:
    """Put the patch's functions in `module`'s globals (keeping what transformers had set as the
    originals), then set the fast-path flag: True where every function has something to run.
    The flag is the module's, not a mixer's: it also overrides a config's use_mamba_kernels=False
    (5.6-5.14's NemotronH and Zamba2), which only made the lookup find nothing."""
    installed = _STATE.installed
    for name in LEGACY_FUNCTIONS:
        current = vars(module).get(name, _ABSENT)
        if current is not installed[(module, name)]:
            _STATE.originals[(module, name)] = current  # transformers' latest lookup
            setattr(module, name, installed[(module, name)])
    if at_patch and any(_STATE.originals[(module, name)] is _ABSENT for name in LEGACY_FUNCTIONS):
        return  # no mixer built yet: its __init__ will look the functions up, then come here
    lacking = [name for name in LEGACY_FUNCTIONS
               if provided(name) is None and not callable(_STATE.originals[(module, name)])]
    key = (module, FAST_PATH_FLAG)
    current = vars(module).get(FAST_PATH_FLAG, _ABSENT)
    if not lacking:
        if current is not True or key not in installed:
            _STATE.originals[key] = current  # what transformers' lookup concluded
            installed[key] = True
            setattr(module, FAST_PATH_FLAG, True)
        return
    if key in installed:  # complete before, not now: transformers' flag back
        del installed[key]
        original = _STATE.originals.pop(key)
        if original is _ABSENT:
            delattr(module, FAST_PATH_FLAG)
        else:
            setattr(module, FAST_PATH_FLAG, original)
    message = (f"{module.__name__}: the mixers' kernel path (cuda_kernels_forward) needs {', '.join(lacking)}, "
               "which mamba-tune does not have yet and transformers did not find: the mixers run their PyTorch "
               "path (torch_forward) without mamba-tune's kernels")
    if _STATE.strict:
        raise NotImplementedError(f"{message}; patch_transformers(strict=True) refuses that")
    if message not in _STATE.warned:
        _STATE.warned.add(message)
        warnings.warn(message, MambaTuneWarning, stacklevel=3)


# --- the switch --------------------------------------------------------------------------


def patch_transformers(strict: bool = False) -> None:
    """Make transformers' Mamba-2 mixers run these kernels (see the module docstring).

    strict: raise NotImplementedError where a mixer calls a function that mamba-tune does
    not have yet (`not_provided()` lists them) instead of warning once and running
    transformers' own (5.0-5.14: also where the mixers' kernel path cannot run at all).
    Calling it again only updates strict.
    Raises TransformersNotInstalledError (an ImportError) without transformers, and
    UnsupportedTransformersError for a transformers before 5.0 or a later one whose modules
    changed.
    """
    with _STATE.lock:
        _STATE.strict = bool(strict)
        if _STATE.installed:
            return
        legacy, modules = _import_transformers()
        installed = _replacements(modules, legacy)
        originals = {(owner, attr): vars(owner).get(attr, _ABSENT) for owner, attr in installed}
        for (owner, attr), new in installed.items():
            setattr(owner, attr, new)
        _STATE.originals, _STATE.installed = originals, installed
        _STATE.warned.clear()
        try:
            for _, module in modules if legacy else ():
                _legacy_install(module, at_patch=True)
        except BaseException:
            unpatch_transformers()
            raise


def unpatch_transformers() -> None:
    """Put back every object `patch_transformers` replaced; a no-op when not patched.

    An attribute that someone else replaced after the patch is left as it is.
    """
    with _STATE.lock:
        for (owner, attr), original in _STATE.originals.items():
            if vars(owner).get(attr) is not _STATE.installed[(owner, attr)]:
                continue
            if original is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)
        _STATE.originals, _STATE.installed = {}, {}
        _STATE.strict = False


def patched_transformers(strict: bool = False) -> contextlib.AbstractContextManager[None]:
    """`with mamba_tune.patched_transformers(): ...` patches for the block, then restores the state before it."""
    return patched_block(_STATE, is_transformers_patched, patch_transformers, unpatch_transformers, strict)


def mixer_functions(model: torch.nn.Module) -> dict[str, dict[str, str]]:
    """What each Mamba-2 mixer class in `model` calls: {mixer class: {function: what runs it}}.

    "mamba_tune.<name>" for a wired function; otherwise a description of transformers' own
    (or, unpatched, "transformers: <what it picked>"). The norm is listed as "norm"; for
    transformers 5.0-5.14, "path" says which forward the mixers take on CUDA.
    """
    out: dict[str, dict[str, str]] = {}
    by_mixer = {family.mixer: family for family in FAMILIES}
    for sub in model.modules():
        cls = type(sub)
        family = by_mixer.get(cls.__name__)
        if family is None or cls.__module__ != family.module or cls.__name__ in out:
            continue
        module = sys.modules[family.module]
        legacy = hasattr(cls, "cuda_kernels_forward")
        calls = {}
        for tf_name in _functions(legacy):
            function = vars(module).get(tf_name)
            if getattr(function, "mamba_tune_legacy_of", None) is module:  # not provided: what transformers found
                original = _STATE.originals.get((module, tf_name))
                calls[tf_name] = (f"transformers' {tf_name} ({_resolved(original)})" if callable(original)
                                  else f"transformers' {tf_name} (none found)")
                continue
            calls[tf_name] = getattr(function, "mamba_tune_runs", None) or (
                f"transformers: {_resolved(function)}" if callable(function) else "transformers: none found")
        norm = getattr(sub, "norm", None)
        if norm is not None and type(norm).__name__.endswith("RMSNormGated"):
            forward = type(norm).forward
            calls["norm"] = getattr(forward, "mamba_tune_runs", None) or f"transformers: {type(norm).__name__}.forward"
        if legacy:
            calls["path"] = ("cuda_kernels_forward (on CUDA)" if vars(module).get(FAST_PATH_FLAG)
                             else "torch_forward (is_fast_path_available is False)")
        out[cls.__name__] = calls
    return out


def patch_from_env() -> None:
    """`import mamba_tune` calls this: MAMBA_TUNE_PATCH_TRANSFORMERS=1 patches, =strict patches strictly."""
    value = env.read(ENV_PATCH)
    if value in (None, "0"):
        return
    patch_transformers(strict=value == "strict")


__all__ = ["ENV_PATCH", "FAMILIES", "FUNCTIONS", "TransformersNotInstalledError", "UnsupportedTransformersError",
           "is_transformers_patched", "mixer_functions", "not_provided", "patch_transformers",
           "patched_transformers", "provided", "unpatch_transformers"]
