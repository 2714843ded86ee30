"""The slice-tuning probe on the CPU: its exit without a GPU, and the layer's row alignment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune_cli.benchmarks.layer import layer_shape
from autotune_cli.presets import MODEL_PRESETS

sys.path.insert(0, str(Path(__file__).parent))
from tune_on_slice import layer_row_align  # noqa: E402


def test_without_a_gpu_it_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("tune_on_slice.py"))], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip() == "tune_on_slice.py: needs a CUDA GPU", r.stderr


@pytest.mark.parametrize(("preset", "align"), [("zamba2-2.7b", 32), ("nemotron-3-nano-30b", 128)])
def test_the_layers_rows(preset: str, align: int) -> None:
    """Zamba2-2.7B's zxbcdt rows are 10448 elements (20896 B: 32 B off 128 B lines); Nano's 10304."""
    s = layer_shape(MODEL_PRESETS[preset], 1, 2, 64)
    assert layer_row_align(s.d_in_proj, s.dim, 2) == align
