"""Helion ref mode on CPU without the test suite's help (kernels/ref_mode.py).

The SSD kernels' tensor-core dots must run on CPU tensors in ref mode from a plain
`import mamba_tune` (training code, `mamba-tune sweep --cpu-dry-run`), not only under a
test fixture; and a call that fails in ref mode must leave the process able to run the
next one.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import helion.language as hl
import pytest
import torch

from mamba_tune import ref_mode

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"


def test_cpu_dot_is_installed_on_the_pinned_helion() -> None:
    # If this fails after a Helion upgrade, its ref-mode dot changed: check whether it
    # runs on CPU tensors now (then drop kernels/ref_mode.install_cpu_dot) or adapt it.
    import mamba_tune.ssd  # noqa: F401  (installs it)

    assert importlib.metadata.version("helion") == "1.5.0"
    assert ref_mode.cpu_dot_installed()
    assert ref_mode.install_cpu_dot()  # idempotent: stays one wrapper around Helion's
    assert not isinstance(hl.dot._ref_fn.helion_dot, ref_mode._CpuDot)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cpu_dot_is_an_fp32_dot_of_the_operands(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 32, generator=g).to(dtype)
    b = torch.randn(32, 8, generator=g).to(dtype)
    acc = torch.randn(16, 8, generator=g)
    dot = ref_mode._CpuDot(hl.dot._ref_fn)
    exact = a.double() @ b.double()
    out = dot(a, b, None, None)
    assert out.dtype == torch.float32
    # bf16/fp16 products are exact in fp32: only the fp32 sums round.
    torch.testing.assert_close(out.double(), exact, atol=1e-5, rtol=1e-5)
    out = dot(a, b, acc, None)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), acc.double() + exact, atol=1e-5, rtol=1e-5)
    assert dot(a, b, None, torch.bfloat16).dtype == torch.bfloat16
    batched = dot(a.expand(3, 16, 32), b, None, None)
    assert batched.shape == (3, 16, 8)


def test_cpu_dot_keeps_fp64_operands_fp64() -> None:
    a = torch.randn(4, 8, dtype=torch.float64)
    b = torch.randn(8, 4, dtype=torch.float64)
    out = ref_mode._CpuDot(hl.dot._ref_fn)(a, b, None, None)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, a @ b, atol=0, rtol=0)


def test_a_changed_helion_dot_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def other_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # not helion 1.5.0's signature
        return a @ b

    monkeypatch.setattr(hl.dot, "_ref_fn", other_dot)
    assert not ref_mode.install_cpu_dot()
    assert hl.dot._ref_fn is other_dot
    monkeypatch.delattr(hl.dot, "_ref_fn")
    assert not ref_mode.install_cpu_dot()


def _product_env(clean_env: dict[str, str]) -> dict[str, str]:
    return {**clean_env, "HELION_INTERPRET": "1"}


@pytest.mark.slow
def test_combined_runs_on_cpu_in_a_plain_process(clean_env: dict[str, str]) -> None:
    # A fresh process without the test suite's fixtures, as a training script on a CPU runs.
    code = """
import torch, mamba_tune
from autotune_cli.reference import ssd_recurrent_ref
from autotune_cli.tuning.ssd.inputs import SSDInputs
dims = dict(batch=1, seqlen=40, nheads=4, headdim=16, ngroups=2, dstate=16, chunk_size=16)
i = SSDInputs.make(dims, torch.bfloat16, "cpu", 0)
y = mamba_tune.mamba_chunk_scan_combined(i.x, i.dt, i.A, i.B, i.C, i.chunk_size)
u = i.upcast()
ref, _ = ssd_recurrent_ref(u.x, u.dt, u.A, u.B, u.C, **u.kwargs())
print(float((y.float() - ref).abs().max()))
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_product_env(clean_env), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert float(r.stdout.split()[-1]) < 5e-2  # bf16 output of an fp32-accumulated forward


@pytest.mark.slow
def test_cpu_dry_run_of_an_ssd_dot_kernel(tmp_path: Path, clean_env: dict[str, str]) -> None:
    spec = tmp_path / "tiny-bmm.yaml"
    text = TINY.read_text().replace("kernels: [gated_norm_fwd, gated_norm_bwd]", "kernels: [ssd_bmm]")
    text = text.replace("seqlen: [64, 40]", "seqlen: [40]").replace("tp: [1, 2]", "tp: [1]")
    assert "ssd_bmm" in text and "[40]" in text
    spec.write_text(text)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "autotune_cli", "sweep", str(spec), "-o", str(out), "--cpu-dry-run",
                        "--log-dir", str(tmp_path / "logs")], cwd=ROOT, env=clean_env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    bundle = json.loads((out / "cpu" / "tiny.json").read_text())
    assert not bundle["failures"]
    assert [e["kernel"] for e in bundle["entries"].values()] == ["ssd_bmm"]
