"""A spec's `shipped` section: the part of the sweep each committed bundle holds, per GPU SKU.

Two forms, one meaning. The flat form names the part for the spec's target SKU:

    shipped:
      tp: [1, 2]
      seqlen: [8192]

The per-SKU form names it for each SKU that has a committed bundle (generated_configs/<sku>/),
every key a known SKU of the target's arch:

    shipped:
      h200: {tp: [1, 2], seqlen: [8192]}
      h100: {tp: [1, 2], seqlen: [8192], kernels: [gated_norm_bwd]}

Each list narrows the sweep's list of the same name (`Shipped`); a value the sweep lacks, an
unknown key, a SKU of another arch and a mix of the two forms are each one line naming the
file, line and field (`fail`). `mamba-tune plan/check --shipped --gpu SKU` read SKU's part.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mamba_tune.sku import GPU_SKUS
from mamba_tune.vocab import DtypeName

if TYPE_CHECKING:
    from collections.abc import Callable

    Fail = Callable[[tuple[Any, ...], str], Exception]  # spec.py's: `<file>:<line>: <field>: <message>`
    Describe = Callable[[dict[str, Any]], str]  # spec.py's words for a pydantic error

# `Spec` below is autotune_cli.spec.Spec, resolved: spec.py imports this module, not the reverse.
Spec = Any
PosInt = Annotated[int, Field(gt=0, strict=True)]


class Shipped(BaseModel):
    """The part of the sweep a committed bundle holds: each list narrows the sweep's list of the
    same name (`tp`: every model's degrees; `batch`, `seqlen`: every model's, per-model ones too)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: list[PosInt] | None = Field(default=None, min_length=1)
    batch: list[PosInt] | None = Field(default=None, min_length=1)
    seqlen: list[PosInt] | None = Field(default=None, min_length=1)
    packed_sequences: list[Annotated[bool, Field(strict=True)]] | None = Field(default=None, min_length=1)
    dtypes: list[DtypeName] | None = Field(default=None, min_length=1)
    norm_weight_dtypes: list[DtypeName] | None = Field(default=None, min_length=1)
    kernels: list[str] | None = Field(default=None, min_length=1)


def shipped_parts(raw: dict[Any, Any], spec: Spec, fail: Fail, describe: Describe) -> dict[str, Spec]:
    """The part of `spec` that each SKU's section of the raw `shipped` mapping names, by SKU."""
    fields, arch = list(Shipped.model_fields), GPU_SKUS[spec.target.gpu].arch
    same_arch = [s for s, g in GPU_SKUS.items() if g.arch == arch]
    for key in raw:
        if key in fields:
            continue
        if key not in GPU_SKUS:
            close = difflib.get_close_matches(str(key), fields + same_arch, n=1, cutoff=0.6)
            raise fail(("shipped", key), f"unknown key {key!r}; " + (
                f"did you mean {close[0]!r}?" if close else
                f"a field ({', '.join(fields)}) or a GPU SKU of {arch} ({', '.join(same_arch)})"))
        if GPU_SKUS[key].arch != arch:
            raise fail(("shipped", key), f"{key} is {GPU_SKUS[key].arch}, but the spec targets "
                       f"{spec.target.gpu} ({arch}); a section is for a SKU of {arch} ({', '.join(same_arch)})")
    skus, flat = [k for k in raw if k in GPU_SKUS], [k for k in raw if k in fields]
    if skus and flat:
        raise fail(("shipped", skus[0]), f"mixes per-SKU sections ({', '.join(skus)}) with the flat form "
                   f"({', '.join(flat)}); put every list under its SKU, e.g. {spec.target.gpu}: {{{flat[0]}: ...}}")
    sections = {sku: (raw[sku], ("shipped", sku)) for sku in skus} if skus else {spec.target.gpu: (raw, ("shipped",))}
    parts: dict[str, Spec] = {}
    for sku, (section, loc) in sections.items():
        if not isinstance(section, dict):
            raise fail(loc, f"the part shipped for {sku} is a mapping of lists ({', '.join(fields)}), "
                       f"got {type(section).__name__}")
        try:
            model = Shipped.model_validate(section)
        except ValidationError as e:
            # An unknown key first, as for the rest of the spec.
            err = min(e.errors(), key=lambda x: x["type"] != "extra_forbidden")
            message = (f"unknown key {err['loc'][-1]!r}; known keys here: {', '.join(fields)}"
                       if err["type"] == "extra_forbidden" else describe(err))
            raise fail((*loc, *err["loc"]), message) from None
        parts[sku] = _part(spec, model, lambda where, msg, loc=loc: fail((*loc, *where), msg))
    return parts


def _subset(values: list[Any], sweep: list[Any], field: str, fail: Fail) -> list[Any]:
    """`values` (the section's FIELD) in the sweep's order; an error names one the sweep lacks or repeats."""
    for i, v in enumerate(values):
        if v not in sweep:
            shown = ", ".join(str(x).lower() if isinstance(x, bool) else str(x) for x in sweep)
            raise fail((field, i), f"{str(v).lower() if isinstance(v, bool) else v} is not in "
                       f"the sweep's {field} ({shown})")
        if v in values[:i]:
            raise fail((field, i), f"{v} listed twice")
    return [v for v in sweep if v in values]


def _part(spec: Spec, shipped: Shipped, fail: Fail) -> Spec:
    """The Spec of the part of `spec` that `shipped` names: each of its lists narrows the sweep's
    (`fail` takes a location inside the section)."""
    tps = list(dict.fromkeys(m.tp for m in spec.models))
    batches = list(dict.fromkeys(b for m in spec.models for b in m.batch))
    seqlens = list(dict.fromkeys(sl for m in spec.models for sl in m.seqlen))
    tp = _subset(shipped.tp, tps, "tp", fail) if shipped.tp else tps
    batch = _subset(shipped.batch, batches, "batch", fail) if shipped.batch else batches
    seqlen = _subset(shipped.seqlen, seqlens, "seqlen", fail) if shipped.seqlen else seqlens
    models = []
    for m in spec.models:
        keep_b, keep_sl = [b for b in m.batch if b in batch], [sl for sl in m.seqlen if sl in seqlen]
        if m.tp in tp and keep_b and keep_sl:
            models.append(m.model_copy(update={"batch": keep_b, "seqlen": keep_sl}))
    if not models:
        raise fail((), "leaves no model shape (no model has a tp, batch and seqlen it keeps)")
    update: dict[str, Any] = {"models": models}
    for field in ("packed_sequences", "dtypes", "norm_weight_dtypes"):
        if getattr(shipped, field):
            update[field] = _subset(getattr(shipped, field), getattr(spec, field), field, fail)
    if shipped.kernels:
        _subset(shipped.kernels, spec.kernels, "kernels", fail)
        update["kernels"] = list(shipped.kernels)  # the section's order, as a spec's own list
    weights = update.get("norm_weight_dtypes", spec.norm_weight_dtypes)
    for d in update.get("dtypes", spec.dtypes):
        if "fp32" not in weights and d not in weights:
            raise fail(("norm_weight_dtypes",), f"dtype {d} gets no norm weight dtype: list fp32 or {d}")
    return spec.model_copy(update=update)


def sweep_section(target: str, shipped_skus: list[str], running: str | None, allow_gpu_mismatch: bool) -> str:
    """The SKU whose part `sweep --shipped` tunes: that of the GPU it runs on (`running`) when the
    spec names a part for it, else the target's. The two differ only with --allow-gpu-mismatch
    (without it, a sweep on a GPU other than the target's stops before it tunes)."""
    if allow_gpu_mismatch and running is not None and running in shipped_skus:
        return running
    return target
