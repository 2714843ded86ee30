"""Helion re-implementations of the mamba-ssm Mamba-2 training kernels.

Drop-in replacements for the mamba-ssm API; each kernel runs the config tuned for the
current GPU from the bundles in `generated_configs/` (see `mamba_tune.runtime`).
`patch_mamba_ssm()` (or MAMBA_TUNE_PATCH_MAMBA_SSM=1 at import) makes mamba-ssm's own
modules call them (see `mamba_tune.patch`); `patch_transformers()` (or
MAMBA_TUNE_PATCH_TRANSFORMERS=1) does the same for transformers' Mamba-2 mixers (see
`mamba_tune.transformers_patch`).
`record_calls(path)` (or MAMBA_TUNE_RECORD=path) records which kernel keys run (see
`mamba_tune.record`).

The names below load on first use (PEP 562), so that the torch-free modules
(`mamba_tune.bundle`, `mamba_tune.vocab`) can be imported without torch and helion: the
`mamba-tune` commands that only read specs and bundles start in a fraction of a second.
Only when MAMBA_TUNE_PATCH_MAMBA_SSM, MAMBA_TUNE_PATCH_TRANSFORMERS or MAMBA_TUNE_RECORD is set does `import mamba_tune`
load the kernels (to patch, to record).

The folder is `kernels/` but the import name is `mamba_tune`: `kernels` is the import name of
Hugging Face's kernels package, which transformers imports when it is installed. Imported
as `kernels` (a script or `python -m pytest` run in the repository's root puts this folder
on the path under that name), this package hands the name over to Hugging Face's package
where that is installed. Otherwise `kernels` becomes an empty module that reads as not installed
(transformers' probe for Hugging Face's package then says no, as it would elsewhere), and any
name looked up in it raises an error saying to import `mamba_tune`.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mamba_tune.conv1d import causal_conv1d_fn, causal_conv1d_update
    from mamba_tune.layer import mamba_split_conv1d_scan_combined
    from mamba_tune.norm import LayerNormGated, RMSNormGated, layernorm_fn, rmsnorm_fn
    from mamba_tune.patch import (
        MambaSsmNotInstalledError,
        is_patched,
        patch_mamba_ssm,
        patched_mamba_ssm,
        unpatch_mamba_ssm,
    )
    from mamba_tune.record import record_calls
    from mamba_tune.runtime import Mode, configure
    from mamba_tune.ssd import mamba_chunk_scan_combined
    from mamba_tune.ssd.selective_state_update import selective_state_update
    from mamba_tune.transformers_patch import (
        TransformersNotInstalledError,
        UnsupportedTransformersError,
        is_transformers_patched,
        patch_transformers,
        patched_transformers,
        unpatch_transformers,
    )


def _hand_over_the_name(name: str) -> None:
    """Imported as `name` (not `mamba_tune`): load the package of that name that is not this
    folder (Hugging Face's kernels) in this module's place. Where there is none, leave an empty
    module in its place that reads as not installed (no `__file__`, no version: what transformers'
    probe takes for a folder shadowing the name) and names `mamba_tune` on any other use."""
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != root]
    spec = PathFinder.find_spec(name, others)
    if spec is None or spec.loader is None:
        sys.modules[name] = _NotInstalled(name, f"{os.path.dirname(__file__)} is mamba-tune's kernel library: "
                                                f"import it as `mamba_tune` (pip install -e {root}), not as `{name}`")
        return
    module = module_from_spec(spec)
    sys.modules[name] = module  # what the running `import` statement returns
    spec.loader.exec_module(module)


class _NotInstalled(types.ModuleType):
    """What `import kernels` gives in the repository's root when Hugging Face's package is absent."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(name, message)
        self.__file__ = None
        self.__path__: list[str] = []
        self._message = message

    def __getattr__(self, attr: str) -> Any:
        raise AttributeError(f"{self._message} (no attribute {attr!r})", name=attr, obj=self)


if __name__ != "mamba_tune":
    _hand_over_the_name(__name__)

_WHERE = {
    "LayerNormGated": "mamba_tune.norm",
    "MambaSsmNotInstalledError": "mamba_tune.patch",
    "Mode": "mamba_tune.runtime",
    "RMSNormGated": "mamba_tune.norm",
    "causal_conv1d_fn": "mamba_tune.conv1d",
    "causal_conv1d_update": "mamba_tune.conv1d",
    "TransformersNotInstalledError": "mamba_tune.transformers_patch",
    "UnsupportedTransformersError": "mamba_tune.transformers_patch",
    "configure": "mamba_tune.runtime",
    "is_patched": "mamba_tune.patch",
    "is_transformers_patched": "mamba_tune.transformers_patch",
    "layernorm_fn": "mamba_tune.norm",
    "mamba_chunk_scan_combined": "mamba_tune.ssd",
    "mamba_split_conv1d_scan_combined": "mamba_tune.layer",
    "patch_mamba_ssm": "mamba_tune.patch",
    "patch_transformers": "mamba_tune.transformers_patch",
    "patched_mamba_ssm": "mamba_tune.patch",
    "patched_transformers": "mamba_tune.transformers_patch",
    "record_calls": "mamba_tune.record",
    "rmsnorm_fn": "mamba_tune.norm",
    "selective_state_update": "mamba_tune.ssd.selective_state_update",
    "unpatch_mamba_ssm": "mamba_tune.patch",
    "unpatch_transformers": "mamba_tune.transformers_patch",
}

__all__ = [
    "LayerNormGated",
    "MambaSsmNotInstalledError",
    "Mode",
    "RMSNormGated",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "TransformersNotInstalledError",
    "UnsupportedTransformersError",
    "configure",
    "is_patched",
    "is_transformers_patched",
    "layernorm_fn",
    "mamba_chunk_scan_combined",
    "mamba_split_conv1d_scan_combined",
    "patch_mamba_ssm",
    "patch_transformers",
    "patched_mamba_ssm",
    "patched_transformers",
    "record_calls",
    "rmsnorm_fn",
    "selective_state_update",
    "unpatch_mamba_ssm",
    "unpatch_transformers",
]


# Submodules that `import mamba_tune` used to load, still reachable as attributes.
_SUBMODULES = ("bundle", "conv1d", "layer", "norm", "patch", "record", "runtime", "ssd", "transformers_patch", "vocab")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"mamba_tune.{name}")
    if name not in _WHERE:
        raise AttributeError(f"module 'mamba_tune' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if __name__ == "mamba_tune":
    # Every MAMBA_TUNE_* variable set, checked against its allowed values (one line naming it
    # when it is not allowed: MambaTuneEnvironmentError); the standard library only.
    from mamba_tune import env as _env
    from mamba_tune import paths as _paths  # noqa: F401  (registers the code-path overrides)

    _env.check()
    # MAMBA_TUNE_PATCH_MAMBA_SSM=1 (or strict) patches mamba-ssm at `import mamba_tune`; unset or 0,
    # nothing loads here.
    if _env.read(_env.PATCH_MAMBA_SSM) not in (None, "0"):
        importlib.import_module("mamba_tune.patch").patch_from_env()
    # MAMBA_TUNE_PATCH_TRANSFORMERS=1 (or strict) patches transformers' Mamba-2 mixers the same way.
    if _env.read(_env.PATCH_TRANSFORMERS) not in (None, "0"):
        importlib.import_module("mamba_tune.transformers_patch").patch_from_env()
    # MAMBA_TUNE_RECORD=FILE records the whole process's kernel keys from `import mamba_tune` on.
    if _env.read(_env.RECORD) is not None:
        importlib.import_module("mamba_tune.record").start_from_env()
