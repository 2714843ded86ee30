"""mamba-ssm's pure-Python modules on a machine without its CUDA extensions (CI's CPU).

CI installs mamba-ssm 2.3.2.post1 without building its extensions (.ci/run:
MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE pip install --no-build-isolation
--no-deps mamba-ssm==2.3.2.post1, plus einops and huggingface_hub). Its package
`__init__` then fails (it imports the Mamba-1 CUDA extension `selective_scan_cuda`), while
the Mamba-2 modules (`modules.mamba2`, `ops.triton.ssd_combined`, `layernorm_gated`)
import fine: their Triton kernels are only compiled when called, and the module falls
back to torch's conv1d without causal_conv1d. `load()` registers the package without
running that `__init__`; where the `__init__` works (the GPU image), it is imported as is.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Iterator


def installed() -> bool:
    return importlib.util.find_spec("mamba_ssm") is not None


def load() -> types.ModuleType:
    """The `mamba_ssm` package, its submodules importable; ImportError when not installed."""
    if "mamba_ssm" in sys.modules:
        return sys.modules["mamba_ssm"]
    spec = importlib.util.find_spec("mamba_ssm")
    if spec is None:
        raise ImportError("mamba-ssm is not installed")
    try:
        return importlib.import_module("mamba_ssm")
    except ImportError as e:
        if "selective_scan_cuda" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
        del sys.modules[name]  # what the failed __init__ left half-imported
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = list(spec.submodule_search_locations or [])
    pkg.__file__ = spec.origin
    pkg.__spec__ = spec
    pkg.__version__ = importlib.metadata.version("mamba_ssm")
    sys.modules["mamba_ssm"] = pkg
    return pkg


@contextlib.contextmanager
def mamba1_importable() -> Iterator[None]:
    """Let mamba-ssm's Mamba-1 modules (`ops.selective_scan_interface` and what imports it, e.g.
    `modules.mamba_simple`) import without their CUDA extension, and leave nothing behind.

    Their module imports `selective_scan_cuda` at the top, though its torch references
    (`selective_scan_ref`) never call it: a stub module stands in for it while the block runs,
    and every `mamba_ssm` module imported under the stub is removed afterwards, so no later test
    sees (or depends on) it. Where the extension exists (the GPU image) nothing is changed."""
    if importlib.util.find_spec("selective_scan_cuda") is not None:
        yield
        return
    before = set(sys.modules)
    sys.modules["selective_scan_cuda"] = types.ModuleType("selective_scan_cuda")
    try:
        yield
    finally:
        for name in set(sys.modules) - before:
            if name == "selective_scan_cuda" or name.startswith("mamba_ssm."):
                del sys.modules[name]
                parent, _, child = name.rpartition(".")
                if parent in sys.modules and getattr(sys.modules[parent], child, None) is not None:
                    delattr(sys.modules[parent], child)
