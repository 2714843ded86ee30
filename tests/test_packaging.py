"""An installed (non-editable) wheel carries the bundles and every package the CLI imports."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kernels.bundle import find_bundles
from kernels.runtime import default_bundle_paths

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
    for pkg in ("autotune_cli", "kernels"):
        for py in (ROOT / pkg).rglob("*.py"):
            rel = py.relative_to(ROOT).as_posix()
            assert rel in names, f"{rel} missing from the wheel"
    assert any(n.endswith("entry_points.txt") for n in names)
