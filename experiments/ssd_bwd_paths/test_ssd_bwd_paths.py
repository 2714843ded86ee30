"""The probes' shared argument handling (`preset_args.py`) and the exit without a GPU of every script
that uses it, on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
EXPERIMENTS = HERE.parent


def _preset_args():  # noqa: ANN202 - the module
    spec = importlib.util.spec_from_file_location("preset_args", HERE / "preset_args.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_presets_with_tensor_parallel_degrees_and_one_line_errors(capsys):
    pa = _preset_args()
    got = pa.parse_presets(["nemotron-3-nano-30b@2", "mamba2-2.7b"], ["zamba2-2.7b"], "prog")
    assert [(label, tp, d.nheads) for label, d, tp in got] == [("nemotron-3-nano-30b@2", 2, 64),
                                                               ("mamba2-2.7b", 1, 80)]
    assert [label for label, _d, _tp in pa.parse_presets([], ["zamba2-2.7b"], "prog")] == ["zamba2-2.7b"]
    assert pa.parse_presets(["nope"], [], "prog") is None
    assert capsys.readouterr().err.startswith("prog: unknown preset 'nope' in 'nope'; known: ")
    assert pa.parse_presets(["mamba2-2.7b@2"], [], "prog") is None
    err = capsys.readouterr().err
    assert err == "prog: 'mamba2-2.7b@2': TP 2 does not divide mamba2-2.7b's heads and groups (allowed: [1])\n"


def test_a_preset_that_raises_does_not_stop_the_others(monkeypatch, capsys):
    pa = _preset_args()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    ran = []

    def one(label: str, dims, tp: int) -> None:  # noqa: ANN001
        ran.append(label)
        if label == "zamba2-2.7b":
            raise RuntimeError("Triton compile failed\nmore lines")

    assert pa.run_per_preset(["zamba2-2.7b", "falcon-h1-0.5b"], [], "prog", one) == 1
    assert ran == ["zamba2-2.7b", "falcon-h1-0.5b"]
    assert capsys.readouterr().err == "prog: zamba2-2.7b: RuntimeError: Triton compile failed\n"
    assert pa.run_per_preset(["falcon-h1-0.5b"], [], "prog", one) == 0
    assert pa.run_per_preset(["nope"], [], "prog", one) == 2


@pytest.mark.parametrize("script", ["ssd_bwd_paths/dbdc_paths.py", "ssd_bwd_paths/dbdc_head_splits.py",
                                    "ssd_bwd_paths/state_passing_bwd_paths.py"])
def test_scripts_without_a_gpu_say_so(script):
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = subprocess.run([sys.executable, str(EXPERIMENTS / script)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and r.stderr.strip().endswith("needs a CUDA GPU"), r.stderr
