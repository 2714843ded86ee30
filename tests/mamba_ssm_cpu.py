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

import importlib
import importlib.metadata
import importlib.util
import sys
import types


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
