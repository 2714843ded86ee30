"""The layout probe's exit without a GPU, on the CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch


def test_without_a_gpu_it_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("time_layouts.py"))], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip() == "time_layouts.py: needs a CUDA GPU", r.stderr
