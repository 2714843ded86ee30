"""Test session set-up.

Without a CUDA GPU (CI, the dev box) the kernels run in Helion ref mode: HELION_INTERPRET
must be set before any kernel module is imported, because Helion reads it when a kernel
is created. Lowering checks need compiled mode and run in subprocesses without it. On the
GPU machine (`pytest -m gpu`) nothing is set and the kernels compile for real.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from xdist_schedule import pytest_collection_modifyitems  # noqa: F401  (a hook: registered by its name)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("HELION_INTERPRET", "1")

# Under pytest-xdist (`-n N`) the workers share the machine's cores: each gets its share of
# torch's CPU threads, as two workers each running two threads on CI's two cores would
# oversubscribe them.
_XDIST_WORKERS = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
if _XDIST_WORKERS and "torch" in sys.modules:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(_XDIST_WORKERS)))

requires_cuda = pytest.mark.skipif(not _HAS_CUDA, reason="needs a CUDA GPU")


@pytest.fixture(scope="session")
def lowering_processes() -> int:
    """How many compiled-mode processes a lowering test splits its cases over: the cores this
    pytest process has, at most two. Alone on CI's two cores that is two; under pytest-xdist
    the workers already keep the cores busy (CI: two workers on two cores), and a second
    process would only add its imports (torch, helion, the kernels: about 7 s of CPU each)
    and lose Helion's per-process cache of kernels bound at the same shapes."""
    return max(1, min(2, (os.cpu_count() or 1) // int(_XDIST_WORKERS or 1)))


@pytest.fixture
def nan_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make torch.empty / empty_like return NaN-filled tensors (FLA's habit): a kernel that
    leaves part of an output unwritten then fails loudly instead of passing on zeros."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def fill(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_empty_like(*a, **k)))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment for subprocesses that must run in Helion's compiled mode (lowering)."""
    env = dict(os.environ)
    env.pop("HELION_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env
