"""GPU SKUs: the one rule that names a GPU's bundle folder, for the tuner and the runtime alike.

`mamba-tune sweep` writes what it tunes on a GPU to `generated_configs/<sku>/`, with
`sku_of(torch.cuda.get_device_name())` in the bundle's provenance; the runtime names the
GPU it runs on with the same function, so that it prefers that SKU's bundles over those of
another SKU of the same compute capability (docs/bundles.md). Torch-free: the spec parser
and the review commands use it without torch.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class GpuSku:
    sku: str
    arch: str
    # Substrings of torch.cuda.get_device_name() that identify the SKU (lower case).
    names: tuple[str, ...]


GPU_SKUS: dict[str, GpuSku] = {
    s.sku: s
    for s in (
        GpuSku("a100", "sm80", ("a100",)),
        GpuSku("a10g", "sm86", ("a10g",)),
        GpuSku("l40s", "sm89", ("l40s",)),
        GpuSku("h100", "sm90", ("h100",)),
        GpuSku("h200", "sm90", ("h200",)),
        GpuSku("gh200", "sm90", ("gh200",)),
        GpuSku("b200", "sm100", ("b200",)),
        GpuSku("gb200", "sm100", ("gb200",)),
        GpuSku("b300", "sm103", ("b300",)),
    )
}


def arch_of(compute_capability: tuple[int, int]) -> str:
    return f"sm{compute_capability[0]}{compute_capability[1]}"


def sku_of(device_name: str) -> str:
    """The SKU for a device name; the longest match wins ('gh200' over 'h200')."""
    name = device_name.lower()
    hits = [(len(n), s.sku) for s in GPU_SKUS.values() for n in s.names if n in name]
    if hits:
        return max(hits)[1]
    # Unknown GPUs still get a stable, path-safe SKU.
    words = [w for w in name.replace("nvidia", "").split() if w.isalnum()]
    return "-".join(words) or "unknown"


def siblings(sku: str) -> list[str]:
    """The known SKUs of the same arch as `sku`, itself left out (h100 -> gh200, h200)."""
    arch = GPU_SKUS[sku].arch if sku in GPU_SKUS else None
    return sorted(s.sku for s in GPU_SKUS.values() if s.arch == arch and s.sku != sku)


@dataclasses.dataclass(frozen=True)
class Gpu:
    """The GPU a kernel call runs on, as the runtime picks bundles for it."""

    name: str  # torch.cuda.get_device_name()
    compute_capability: str  # "9.0", as a bundle's provenance.gpu records it
    sku: str  # sku_of(name): the bundle folder `mamba-tune sweep` writes on this GPU
    arch: str  # "sm90"

    @classmethod
    def of(cls, name: str, compute_capability: tuple[int, int]) -> Gpu:
        major, minor = compute_capability
        return cls(name, f"{major}.{minor}", sku_of(name), arch_of(compute_capability))
