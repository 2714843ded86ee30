"""An installed (non-editable) wheel carries the bundles and every package the CLI imports."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mamba_tune.bundle import find_bundles
from mamba_tune.runtime import ENV_CONFIGS, default_bundle_paths

ROOT = Path(__file__).resolve().parents[2]

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
    # hashes (mamba_tune.keys) find their files in the installed package.
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    # The working directory holds a package named generated_configs (a user's copy of the
    # repository's folder): the runtime still reads the installed bundles.
    stray = tmp_path / "generated_configs"
    (stray / "h100").mkdir(parents=True)
    (stray / "__init__.py").write_text("")
    code = ("import mamba_tune, mamba_tune.keys as k, mamba_tune.store as s; print(mamba_tune.__file__); "
            "print(len({n: key.source_sha256() for n, key in k.all_keys().items()})); "
            "print(*s.default_bundle_paths())")
    env = {n: v for n, v in os.environ.items() if n != ENV_CONFIGS}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**env, "PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stderr[-3000:]
    where, count, bundles = r.stdout.split()
    assert Path(where).is_relative_to(site) and int(count) >= 10
    assert Path(bundles) == site / "generated_configs" and find_bundles([Path(bundles)])


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_torch_is_pinned_to_the_tested_range():
    """`pip install -e .` must not resolve to a torch no figure was measured with: the GPU path
    is tested with 2.11, the CPU suite with 2.13 (the one running this test)."""
    import torch
    from packaging.requirements import Requirement
    from packaging.version import Version

    (req,) = [Requirement(d) for d in _pyproject()["project"]["dependencies"] if Requirement(d).name == "torch"]
    tested = Version(torch.__version__.split("+")[0])
    for version, ok in (("2.11.0", True), (str(tested), True), ("2.9.0", False), ("2.14.1", False)):
        assert req.specifier.contains(version) is ok, (str(req), version)


# Imported by tests, installed outside the extras on purpose: mamba-ssm's tests skip without it
# (README: built from source with MAMBA_SKIP_CUDA_BUILD).
NOT_AN_EXTRA = {"mamba_ssm"}


def test_every_third_party_import_of_the_tests_is_declared():
    """A clean `pip install -e '.[test]'` has everything the tests import (einops was missing)."""
    import ast
    import importlib.metadata

    from packaging.requirements import Requirement

    project = _pyproject()["project"]
    declared = {Requirement(d).name.lower().replace("_", "-")
                for d in [*project["dependencies"], *project["optional-dependencies"]["test"]]}
    local = {p.stem for p in (ROOT / "tests").rglob("*.py")} | {"autotune_cli", "mamba_tune", "generated_configs"}
    dists = importlib.metadata.packages_distributions()
    missing = {}
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in (n.split(".")[0] for n in names):
                if name in sys.stdlib_module_names or name in local or name in NOT_AN_EXTRA:
                    continue
                dist = [d.lower().replace("_", "-") for d in dists.get(name, [name])]
                if not set(dist) & declared:
                    missing.setdefault(name, path.relative_to(ROOT).as_posix())
    assert not missing, f"imported by the tests, not in pyproject's dependencies or test extra: {missing}"
