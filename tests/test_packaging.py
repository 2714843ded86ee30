"""An installed (non-editable) wheel carries the bundles and every package the CLI imports."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mamba_tune.bundle import find_bundles
from mamba_tune.runtime import default_bundle_paths

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_wheel_contains_bundles_and_packages(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = tmp_path.glob("mamba_tune-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in find_bundles(default_bundle_paths()):
        rel = path.relative_to(ROOT).as_posix()
        assert rel in names, f"{rel} missing from the wheel"
    # The folder kernels/ installs as the package mamba_tune.
    for folder, pkg in (("autotune_cli", "autotune_cli"), ("kernels", "mamba_tune")):
        for py in (ROOT / folder).rglob("*.py"):
            rel = Path(pkg, py.relative_to(ROOT / folder)).as_posix()
            assert rel in names, f"{rel} missing from the wheel"
    assert not any(n.startswith("kernels/") for n in names)  # Hugging Face's kernels package's name
    # Experiments and measured results stay in the repository, outside the product.
    assert not [n for n in names if n.startswith(("experiments/", "benchmarks/", "autotune_cli/benchmarks/results/"))]
    assert any(n.endswith("entry_points.txt") for n in names)

    # Installed (no repository on the path): the kernels import, and the torch-free source
    # hashes (kernel_keys) find their files in the installed package.
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    code = ("import mamba_tune, autotune_cli.kernel_keys as k; print(mamba_tune.__file__); "
            "print(len({n: key.source_sha256() for n, key in k.all_keys().items()}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stderr[-3000:]
    where, count = r.stdout.split()
    assert Path(where).is_relative_to(site) and int(count) >= 10
