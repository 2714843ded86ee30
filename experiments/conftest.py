"""Set-up for the experiments' tests: on a machine without a CUDA GPU the kernels run in Helion's
ref mode, as in tests/conftest.py (HELION_INTERPRET must be set before a kernel module is
imported); the repository's root is importable."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
