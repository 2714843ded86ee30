"""Host-side copies during a call: the copy ops dispatched outside the project's kernels.

`HostCopies` records (op, shape) for each `copy_`, `cat`, `_to_copy` or `clone` that no kernel
issues (`runtime.run` is wrapped to pause it while a kernel runs, so a kernel's own work in ref
mode is not counted); `ours_only` keeps only the ops the project's code issues (not autograd's
or the caller's). Used by the layer's and the SSD drop-in's host-copy tests.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mamba_tune
from mamba_tune import runtime

COPIES = frozenset(("copy_", "cat", "_to_copy", "clone"))
OURS = str(Path(mamba_tune.__file__).resolve().parent)


class HostCopies(TorchDispatchMode):
    """(op, shape) of each copy op dispatched while no kernel runs (see the module docstring)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, ours_only: bool = False) -> None:
        super().__init__()
        self.seen: list[tuple[str, tuple[int, ...]]] = []
        self.ours_only = ours_only
        self.in_kernel = 0
        real_run = runtime.run

        def run(*args: Any, **kwargs: Any) -> Any:
            self.in_kernel += 1
            try:
                return real_run(*args, **kwargs)
            finally:
                self.in_kernel -= 1

        monkeypatch.setattr(runtime, "run", run)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if (not self.in_kernel and func.overloadpacket.__name__ in COPIES and isinstance(out, torch.Tensor)
                and (not self.ours_only
                     or any(str(Path(f.filename).resolve()).startswith(OURS) for f in traceback.extract_stack()))):
            self.seen.append((func.overloadpacket.__name__, tuple(out.shape)))
        return out
