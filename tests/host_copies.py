"""Host-side copies during a call: the copy ops dispatched outside the project's kernels.

`HostCopies` records (op, shape) for each `copy_`, `cat`, `_to_copy` or `clone` that no kernel
issues (`runtime.run` is wrapped to pause it while a kernel runs, so a kernel's own work in ref
mode is not counted); `ours_only` keeps only the ops the project's code issues (not autograd's
or the caller's); `ops=SYNCS` records the ops that read tensor values on the host instead. Used
by the layer's and the SSD drop-in's host-copy tests.
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
# The ops that read a tensor's values on the host (a GPU sync, and no CUDA-graph capture): item(),
# bool() / int() / float() of a tensor, and the ops whose output shape depends on values.
SYNCS = frozenset(("_local_scalar_dense", "is_nonzero", "equal", "nonzero", "nonzero_static", "masked_select",
                   "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim", "repeat_interleave"))
OURS = str(Path(mamba_tune.__file__).resolve().parent)


class HostCopies(TorchDispatchMode):
    """(op, shape) of each copy op dispatched while no kernel runs (see the module docstring)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, ours_only: bool = False, ops: frozenset[str] = COPIES) -> None:
        super().__init__()
        self.ops = ops
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
        if (not self.in_kernel and func.overloadpacket.__name__ in self.ops
                and (not self.ours_only
                     or any(str(Path(f.filename).resolve()).startswith(OURS) for f in traceback.extract_stack()))):
            self.seen.append((func.overloadpacket.__name__, tuple(out.shape) if isinstance(out, torch.Tensor) else ()))
        return out
