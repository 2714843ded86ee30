"""One switch: run mamba-ssm's own modules on these kernels.

`patch_mamba_ssm()` replaces, in mamba-ssm 2.3.2.post1's modules, the names its Mamba-2
code calls: `mamba_chunk_scan_combined` (in `ops.triton.ssd_combined` and in every module
that imported it by name: `modules.mamba2`, `modules.mamba2_simple`, `modules.ssd_minimal`),
`mamba_split_conv1d_scan_combined` (the fused layer of Mamba2's default
`use_mem_eff_path=True`: in `ops.triton.ssd_combined`, `modules.mamba2`,
`modules.mamba2_simple`) and the gated norm (`rmsnorm_fn`, `layernorm_fn`, `RMSNorm`, `LayerNorm` of
`ops.triton.layernorm_gated`, `rmsnorm_fn` in `ssd_combined`, `RMSNormGated` in
`modules.mamba2`, `mamba2_simple` and `mamba3`, `LayerNorm` in `mamba2_simple`), and the
decoding step `selective_state_update` (in `ops.triton.selective_state_update` and where
`modules.mamba2` (Mamba2.step) and `modules.mamba_simple` (Mamba.step, when its CUDA
extension imports) imported it by name).
Modules are looked up by name at call time, so code that imported the mamba-ssm modules
before the patch runs the kernels too. Norm modules built before the patch stay
mamba-ssm's class, but their forward calls `layernorm_gated.rmsnorm_fn`, which is ours.

Every function mamba-ssm 2.3.2.post1's Mamba-2 modules call has a kernel here. A function
listed in `NOT_PROVIDED` (none today; the place for one that a later mamba-ssm adds) is never
replaced silently: while patched it runs mamba-ssm's kernel and warns once
(`MambaTuneWarning`) naming itself; with `strict=True` it raises `NotImplementedError`.

Where the causal-conv1d package is not installed, `modules.mamba2` has None for
`causal_conv1d_fn` and `causal_conv1d_update`, and Mamba2 falls back to torch (nn.Conv1d plus
SiLU, a decode step of torch ops, and no packed sequences: it asserts `seq_idx is None`). The
patch fills those two with the kernels here; an installed package's functions are left alone
(its conv1d backward is faster than ours today: the layer's `conv1d_bwd` row in docs/results.md).

`unpatch_mamba_ssm()` puts back exactly the objects it replaced; both functions are
idempotent. `MAMBA_TUNE_PATCH_MAMBA_SSM=1` (or `strict`) patches at `import mamba_tune`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from mamba_tune import env
from mamba_tune.conv1d.causal_conv1d import causal_conv1d_fn
from mamba_tune.conv1d.update import causal_conv1d_update
from mamba_tune.layer.split_conv1d_scan import mamba_split_conv1d_scan_combined
from mamba_tune.norm.gated import LayerNormGated, RMSNormGated, layernorm_fn, rmsnorm_fn
from mamba_tune.runtime import MambaTuneWarning
from mamba_tune.ssd.combined import mamba_chunk_scan_combined
from mamba_tune.ssd.selective_state_update import selective_state_update

ENV_PATCH = env.PATCH_MAMBA_SSM
# The version whose modules and call signatures the patch was written against.
MAMBA_SSM_VERSION = "2.3.2.post1"

_SSD = "mamba_ssm.ops.triton.ssd_combined"
_NORM = "mamba_ssm.ops.triton.layernorm_gated"
_MAMBA2 = "mamba_ssm.modules.mamba2"
_STATE_UPDATE = "mamba_ssm.ops.triton.selective_state_update"
_MAMBA1 = "mamba_ssm.modules.mamba_simple"

# Modules the patch needs; an import error in one of them is the user's error.
_REQUIRED = (_NORM, _SSD, _MAMBA2)
# Modules patched when they import (mamba3 pulls in optional kernels, mamba_simple the
# Mamba-1 CUDA extension; the others are plain Python, but a mamba-ssm without them has
# nothing there to patch).
_OPTIONAL = ("mamba_ssm.modules.mamba2_simple", "mamba_ssm.modules.mamba3", "mamba_ssm.modules.ssd_minimal",
             _STATE_UPDATE, _MAMBA1)

# (module, attribute) -> what replaces it.
_REPLACEMENTS: dict[tuple[str, str], Any] = {
    (_NORM, "rmsnorm_fn"): rmsnorm_fn,
    (_NORM, "layernorm_fn"): layernorm_fn,
    (_NORM, "RMSNorm"): RMSNormGated,
    (_NORM, "LayerNorm"): LayerNormGated,
    (_SSD, "mamba_chunk_scan_combined"): mamba_chunk_scan_combined,
    (_SSD, "rmsnorm_fn"): rmsnorm_fn,
    (_SSD, "mamba_split_conv1d_scan_combined"): mamba_split_conv1d_scan_combined,
    (_MAMBA2, "mamba_split_conv1d_scan_combined"): mamba_split_conv1d_scan_combined,
    ("mamba_ssm.modules.mamba2_simple", "mamba_split_conv1d_scan_combined"): mamba_split_conv1d_scan_combined,
    (_MAMBA2, "mamba_chunk_scan_combined"): mamba_chunk_scan_combined,
    (_MAMBA2, "RMSNormGated"): RMSNormGated,
    ("mamba_ssm.modules.mamba2_simple", "mamba_chunk_scan_combined"): mamba_chunk_scan_combined,
    ("mamba_ssm.modules.mamba2_simple", "RMSNormGated"): RMSNormGated,
    ("mamba_ssm.modules.mamba2_simple", "LayerNorm"): LayerNormGated,
    ("mamba_ssm.modules.mamba3", "RMSNormGated"): RMSNormGated,
    ("mamba_ssm.modules.ssd_minimal", "mamba_chunk_scan_combined"): mamba_chunk_scan_combined,
    (_STATE_UPDATE, "selective_state_update"): selective_state_update,
    (_MAMBA2, "selective_state_update"): selective_state_update,
    (_MAMBA1, "selective_state_update"): selective_state_update,
}

# (module, attribute) -> what fills it only where it is None (an optional package that is
# not installed; see the module docstring).
FILL_IF_ABSENT: dict[tuple[str, str], Any] = {
    (_MAMBA2, "causal_conv1d_fn"): causal_conv1d_fn,
    (_MAMBA2, "causal_conv1d_update"): causal_conv1d_update,
}

# mamba-ssm functions with no kernel here yet: (module, attribute) -> who calls it, and
# what runs the kernels instead.
NOT_PROVIDED: dict[tuple[str, str], str] = {
}


class MambaSsmNotInstalledError(ImportError):
    """patch_mamba_ssm() was called where mamba-ssm cannot be imported."""


@dataclasses.dataclass
class _State:
    """A switch's state (this module's and mamba_tune.transformers_patch's): keys are
    (module name, attribute) here, (owner object, attribute) there."""

    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)
    # (module, attribute) -> the original object, for every attribute replaced.
    originals: dict[tuple[Any, str], Any] = dataclasses.field(default_factory=dict)
    # (module, attribute) -> what was put there (to restore only what is still ours).
    installed: dict[tuple[Any, str], Any] = dataclasses.field(default_factory=dict)
    strict: bool = False
    warned: set[str] = dataclasses.field(default_factory=set)


_STATE = _State()


def is_patched() -> bool:
    """Whether mamba-ssm's modules currently call these kernels."""
    return bool(_STATE.installed)


def _import(name: str) -> Any:
    return importlib.import_module(name)


def _import_required() -> dict[str, Any]:
    if importlib.util.find_spec("mamba_ssm") is None:
        raise MambaSsmNotInstalledError(
            f"patch_mamba_ssm: the mamba-ssm package is not installed (pip install mamba-ssm=={MAMBA_SSM_VERSION})")
    modules = {}
    for name in _REQUIRED:
        try:
            modules[name] = _import(name)
        except ImportError as e:
            raise MambaSsmNotInstalledError(
                f"patch_mamba_ssm: mamba-ssm is installed but {name} does not import: {e}") from e
    return modules


def _not_provided(name: str, use: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """`original` behind a notice: it runs mamba-ssm's kernel (warning once), or raises if strict."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _STATE.strict:
            raise NotImplementedError(f"mamba-tune has no kernel for {name} yet ({use}); "
                                      "patch_mamba_ssm(strict=True) does not run mamba-ssm's")
        if name not in _STATE.warned:
            _STATE.warned.add(name)
            warnings.warn(f"mamba-tune has no kernel for {name} yet ({use}); this runs mamba-ssm's own {name}",
                          MambaTuneWarning, stacklevel=2)
        return original(*args, **kwargs)

    return call


def patch_mamba_ssm(strict: bool = False) -> None:
    """Make mamba-ssm's modules run these kernels (see the module docstring for what is replaced).

    strict: raise NotImplementedError where mamba-ssm calls a function that has no kernel
    here (listed in NOT_PROVIDED; none today) instead of running mamba-ssm's own with a
    one-time warning. Calling it again only updates strict.
    Raises MambaSsmNotInstalledError (an ImportError) when mamba-ssm cannot be imported.
    """
    with _STATE.lock:
        _STATE.strict = bool(strict)
        if _STATE.installed:
            return
        modules = _import_required()
        for name in _OPTIONAL:
            try:
                modules[name] = _import(name)
            except ImportError:
                continue  # not importable: nothing can call it, so nothing to replace
        originals: dict[tuple[str, str], Any] = {}
        installed: dict[tuple[str, str], Any] = {}
        for (mod, attr), new in _REPLACEMENTS.items():
            if mod in modules and hasattr(modules[mod], attr):
                originals[(mod, attr)] = getattr(modules[mod], attr)
                installed[(mod, attr)] = new
        for (mod, attr), new in FILL_IF_ABSENT.items():
            if mod in modules and hasattr(modules[mod], attr) and getattr(modules[mod], attr) is None:
                originals[(mod, attr)] = None
                installed[(mod, attr)] = new
        shims: dict[int, Callable[..., Any]] = {}  # one notice per original function
        for (mod, attr), use in NOT_PROVIDED.items():
            original = getattr(modules.get(mod), attr, None)
            if original is None:  # the name exists but its import failed in mamba-ssm: nothing to wrap
                continue
            originals[(mod, attr)] = original
            installed[(mod, attr)] = shims.setdefault(id(original), _not_provided(attr, use, original))
        for (mod, attr), new in installed.items():
            setattr(modules[mod], attr, new)
        _STATE.originals, _STATE.installed = originals, installed
        _STATE.warned.clear()


def unpatch_mamba_ssm() -> None:
    """Put back every object `patch_mamba_ssm` replaced; a no-op when not patched.

    An attribute that someone else replaced after the patch is left as it is.
    """
    with _STATE.lock:
        for (mod, attr), original in _STATE.originals.items():
            module = sys.modules.get(mod)
            if module is not None and getattr(module, attr, None) is _STATE.installed[(mod, attr)]:
                setattr(module, attr, original)
        _STATE.originals, _STATE.installed = {}, {}
        _STATE.strict = False


def patched_mamba_ssm(strict: bool = False) -> contextlib.AbstractContextManager[None]:
    """`with mamba_tune.patched_mamba_ssm(): ...` patches for the block, then restores the state before it."""
    return patched_block(_STATE, is_patched, patch_mamba_ssm, unpatch_mamba_ssm, strict)


@contextlib.contextmanager
def patched_block(state: _State, is_on: Callable[[], bool], patch: Callable[..., None],
                  unpatch: Callable[[], None], strict: bool) -> Iterator[None]:
    """Patch for the block, then put back the state before it: still patched (with its old
    strictness) if it was, unpatched if not. Shared by both switches (mamba-ssm, transformers)."""
    with state.lock:
        was_patched, was_strict = is_on(), state.strict
        patch(strict=strict)
    try:
        yield
    finally:
        with state.lock:
            if was_patched:
                state.strict = was_strict
            else:
                unpatch()


def patch_from_env() -> None:
    """`import mamba_tune` calls this: MAMBA_TUNE_PATCH_MAMBA_SSM=1 patches, =strict patches strictly."""
    value = env.read(ENV_PATCH)
    if value in (None, "0"):
        return
    patch_mamba_ssm(strict=value == "strict")


__all__ = ["ENV_PATCH", "MambaSsmNotInstalledError", "is_patched", "patch_mamba_ssm", "patched_mamba_ssm",
           "unpatch_mamba_ssm"]
