"""The folder kernels/ imports as `mamba_tune`; the name `kernels` stays Hugging Face's.

Run from the repository's root (a script there, `python -m pytest`), the folder is on the path
under the name `kernels`, ahead of site-packages. Imported under that name it hands the name to
Hugging Face's kernels package where that is installed (transformers imports it to load hub
kernels), and otherwise reads as not installed and says how to import the project.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_in_root(code: str) -> subprocess.CompletedProcess[str]:
    # `python -c` puts the working directory first on sys.path, as a script in the root would.
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def hf_kernels_installed() -> bool:
    # find_spec("kernels") from here would find the repository's folder only when the root is on
    # the path; look in site-packages alone.
    from importlib.machinery import PathFinder

    others = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    return PathFinder.find_spec("kernels", others) is not None


def test_the_link_names_the_folder():
    assert (ROOT / "mamba_tune").is_symlink() and (ROOT / "mamba_tune").readlink() == Path("kernels")


def test_the_project_imports_as_mamba_tune():
    r = run_in_root("import mamba_tune; print(mamba_tune.__file__); print(mamba_tune.rmsnorm_fn.__module__)")
    assert r.returncode == 0, r.stderr
    where, module = r.stdout.split()
    # Found through the link mamba_tune -> kernels in the root, so a checkout runs its own copy.
    assert Path(where).resolve() == ROOT / "kernels" / "__init__.py" and module == "mamba_tune.norm.gated"


def test_without_hugging_face_kernels_the_old_name_reads_as_not_installed_and_says_what_to_import():
    # The path without site-packages: no Hugging Face kernels package to hand the name to.
    code = ("import sys; sys.path[:] = [p for p in sys.path if 'site-packages' not in p and 'dist-packages' not in p]; "
            "import kernels; print(kernels.__file__, getattr(kernels, '__version__', 'N/A')); kernels.rmsnorm_fn")
    r = run_in_root(code)
    assert r.returncode == 1 and r.stdout.split() == ["None", "N/A"], (r.stdout, r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("AttributeError: ") and "import it as `mamba_tune`" in last, r.stderr


# Run first in a process that must not see Hugging Face's kernels package (nor its metadata).
HIDE_HF_KERNELS = """
import importlib.machinery as m
find_spec, find_distributions = m.PathFinder.find_spec, m.PathFinder.find_distributions
def hidden(origin):
    return 'site-packages' in str(origin) or 'dist-packages' in str(origin)
def spec_without(name, path=None, target=None):
    spec = find_spec(name, path, target)
    return None if name == 'kernels' and spec is not None and hidden(spec.origin) else spec
def distributions_without(*args, **kw):
    return (d for d in find_distributions(*args, **kw) if d.metadata['Name'] != 'kernels')
m.PathFinder.find_spec = staticmethod(spec_without)
m.PathFinder.find_distributions = staticmethod(distributions_without)
"""


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers (the test extra)")
def test_transformers_imports_in_the_checkout_without_hugging_face_kernels():
    # Found on the H200 image (transformers 5.17, no Hugging Face kernels): run from the root,
    # transformers' probe found this folder as `kernels`, imported it, and every Mamba-2 model's
    # import failed. Now the probe says "not installed", as it does outside the checkout.
    code = HIDE_HF_KERNELS + (
        "from transformers.utils import is_kernels_available; "
        "from transformers import Mamba2ForCausalLM, NemotronHForCausalLM; "
        "import sys; print(is_kernels_available(), type(sys.modules['kernels']).__name__)")
    r = run_in_root(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["False", "_NotInstalled"]


@pytest.mark.skipif(not hf_kernels_installed(), reason="Hugging Face's kernels package is not installed "
                    "(the test extra installs it: pip install -e '.[test]')")
def test_hugging_face_kernels_keeps_its_name_beside_the_checkout():
    code = ("import kernels, mamba_tune; from kernels import get_kernel; "
            "print(kernels.__file__); print(mamba_tune.__file__)")
    r = run_in_root(code)
    assert r.returncode == 0, r.stderr
    hf, ours = r.stdout.split()
    # (CI's virtual environment lives inside the checkout: compare with the folder, not the root.)
    assert not Path(hf).resolve().is_relative_to(ROOT / "kernels") and Path(ours).is_relative_to(ROOT)


@pytest.mark.skipif(not hf_kernels_installed() or importlib.util.find_spec("transformers") is None,
                    reason="needs Hugging Face's kernels and transformers (the test extra installs both)")
def test_transformers_sees_the_same_kernels_package_in_the_checkout_as_elsewhere(tmp_path):
    # transformers probes for `kernels` (its hub-kernel integration imports it when a usable
    # version is installed). From the root it must find what it finds anywhere else.
    code = ("from transformers.utils import is_kernels_available; "
            "from transformers.utils.import_utils import _is_package_available; "
            "import transformers.integrations.hub_kernels; import kernels; "
            "print(_is_package_available('kernels', return_version=True), is_kernels_available(), "
            "hasattr(kernels, 'get_kernel'))")
    in_root = run_in_root(code)
    elsewhere = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                               timeout=300)
    assert in_root.returncode == 0, in_root.stderr[-3000:]
    assert elsewhere.returncode == 0, elsewhere.stderr[-3000:]
    assert in_root.stdout == elsewhere.stdout and in_root.stdout.startswith("(True, ")
    assert in_root.stdout.split()[-1] == "True"
