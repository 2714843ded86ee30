"""What the kernels and the file system accept, checked before anything runs or is written:
names that are safe file names (a spec's or bundle's name, a kernel's in a report) and dims
the kernels can run (`dims_problem`: flags, chunk_size, headdim and dstate limits, and no
tensor over 2**31 - 1 elements, as the kernels index with int32).
"""

from __future__ import annotations

import math
import re

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
SAFE_NAME_TEXT = "1-100 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit"
MAX_HEADDIM = 256
MAX_DSTATE = 256
MIN_CHUNK_SIZE, MAX_CHUNK_SIZE = 16, 256
MAX_ELEMENTS = 2**31 - 1


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a bundle's file name, or None when it can."""
    if SAFE_NAME.fullmatch(name) and ".." not in name:
        return None
    return f"{name!r} is not a safe file name ({SAFE_NAME_TEXT}, no '..')"


def _is_pow2(n: int) -> bool:
    return n > 0 and not n & (n - 1)


def dims_problem(dims: dict[str, int]) -> str | None:
    """Why the kernels cannot run a combo with these dims (named as in kernel keys and
    specs), or None. Checks only the dims present, so it serves every kernel's key."""
    for k, v in dims.items():
        if k.startswith(("has_", "is_")) or k in ("norm_before_gate", "weight_fp32", "dt_softplus"):
            if v not in (0, 1):
                return f"{k}={v}: a flag is 0 or 1"
        elif v < 1:
            return f"{k}={v}: must be at least 1"
    cs = dims.get("chunk_size")
    if cs is not None and not (_is_pow2(cs) and MIN_CHUNK_SIZE <= cs <= MAX_CHUNK_SIZE):
        return f"chunk_size={cs}: the kernels need a power of two in {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}"
    for k, top in (("headdim", MAX_HEADDIM), ("dstate", MAX_DSTATE)):
        if dims.get(k, 0) > top:
            return f"{k}={dims[k]}: at most {top}"
    for a, b in (("ngroups", "nheads"), ("group_size", "d")):
        if a in dims and b in dims and dims[b] % dims[a]:
            return f"{a}={dims[a]} does not divide {b}={dims[b]}"
    big = largest_tensor(dims)
    if big is not None and big[1] > MAX_ELEMENTS:
        return f"{big[0]} has {big[1]:,} elements, over 2**31 - 1 (the kernels index with int32)"
    return None


def largest_tensor(dims: dict[str, int]) -> tuple[str, int] | None:
    """The largest tensor a combo with these dims touches: (what it is, elements)."""
    g = dims.get
    sizes: list[tuple[str, int]] = []
    if "rows" in dims and "d" in dims:
        sizes.append(("x (rows, d)", dims["rows"] * dims["d"]))
    b, sl, cs = g("batch"), g("seqlen"), g("chunk_size")
    if b is not None and sl is not None:
        h, p, ng, n = g("nheads"), g("headdim"), g("ngroups"), g("dstate")
        if h is not None and p is not None:
            sizes.append(("x (batch, seqlen, nheads, headdim)", b * sl * h * p))
        if ng is not None and n is not None:
            sizes.append(("B (batch, seqlen, ngroups, dstate)", b * sl * ng * n))
        if cs is not None:
            c = math.ceil(sl / cs)
            if h is not None and p is not None and n is not None:
                sizes.append(("states (batch, nchunks, nheads, headdim, dstate)", b * c * h * p * n))
            if ng is not None:
                sizes.append(("CB (batch, nchunks, ngroups, chunk_size, chunk_size)", b * c * ng * cs * cs))
            if h is not None:
                sizes.append(("dA_cumsum (batch, nheads, nchunks, chunk_size)", b * h * c * cs))
    return max(sizes, key=lambda t: t[1]) if sizes else None
