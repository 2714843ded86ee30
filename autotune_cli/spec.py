"""Sweep specs: YAML in, a validated `Spec` out, or one line naming file, line and field.

    name: nemotron-nano                  # optional; defaults to the file's stem
    target: {gpu: h200, arch: sm90}      # the GPU the sweep is for (arch optional)
    models:
      - preset: nemotron-3-nano-30b      # a name from autotune_cli.presets.MODEL_PRESETS
        tp: [1, 2]                       # tensor-parallel degrees: split nheads and ngroups
      - name: my-model                   # or explicit dims
        dims: {nheads: 64, headdim: 64, ngroups: 8, dstate: 128, chunk_size: 128}
        tp: [1]
        batch: [4]                       # optional per-model override of batch / seqlen
    batch: [2]
    seqlen: [8192, 4096]
    packed_sequences: [false, true]      # optional, default [false]: true also tunes the SSD
                                         #   kernels for calls with seq_idx (packed sequences)
    dtypes: [bf16]                       # bf16 | fp16 | fp32
    kernels: all                         # or a list of kernel names (mamba-tune plan lists them)
    budget:
      effort: quick                      # Helion effort: none | quick | full
      seconds_per_combo: 300             # cap on the search's wall time (optional)
      algorithm: LFBOTreeSearch          # a Helion search algorithm
      max_generations: null              # optional cap on generations
      seed: 0                            # autotuner random seed
    tolerances:                          # per dtype; a config passes when, per output,
      bf16: {atol: 0.01, factor: 2.0}    #   err(kernel) <= factor * err(eager torch in dtype) + atol
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autotune_cli.presets import GPU_SKUS, MODEL_PRESETS, SEARCH_ALGORITHMS, ModelDims
from kernels.vocab import DtypeName

Effort = Literal["none", "quick", "full"]
PosInt = Annotated[int, Field(gt=0, strict=True)]


class SpecError(ValueError):
    """One line: `<file>:<line>: <field path>: <what is wrong>`."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Target(_Strict):
    gpu: str = Field(description="GPU SKU, e.g. h200")
    arch: str | None = Field(default=None, description="compute arch, e.g. sm90; must match the SKU")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        if v not in GPU_SKUS:
            raise ValueError(f"unknown GPU {v!r}; known: {', '.join(GPU_SKUS)}")
        return v


class ExplicitDims(_Strict):
    nheads: PosInt | None = None
    headdim: PosInt
    ngroups: PosInt
    dstate: PosInt
    chunk_size: PosInt
    d_model: PosInt | None = None
    d_inner: PosInt | None = Field(default=None, description="nheads * headdim; give it instead of nheads")


class ModelEntry(_Strict):
    preset: str | None = None
    name: str | None = None
    dims: ExplicitDims | None = None
    tp: list[PosInt] = Field(default_factory=lambda: [1], min_length=1)
    batch: list[PosInt] | None = Field(default=None, min_length=1)
    seqlen: list[PosInt] | None = Field(default=None, min_length=1)


class Budget(_Strict):
    effort: Effort = "quick"
    seconds_per_combo: PosInt | None = None
    algorithm: str = "LFBOTreeSearch"
    max_generations: PosInt | None = None
    seed: Annotated[int, Field(ge=0, strict=True)] = 0

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, v: str) -> str:
        if v not in SEARCH_ALGORITHMS:
            raise ValueError(f"unknown search algorithm {v!r}; one of {', '.join(SEARCH_ALGORITHMS)}")
        return v


class Tolerance(_Strict):
    atol: Annotated[float, Field(ge=0)]
    factor: Annotated[float, Field(ge=1)] = 2.0


DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "bf16": Tolerance(atol=1e-2, factor=2.0),
    "fp16": Tolerance(atol=2e-3, factor=2.0),
    "fp32": Tolerance(atol=1e-4, factor=2.0),
}


class SpecModel(_Strict):
    name: str | None = None
    description: str | None = None
    target: Target
    models: list[ModelEntry] = Field(min_length=1)
    batch: list[PosInt] = Field(min_length=1)
    seqlen: list[PosInt] = Field(min_length=1)
    packed_sequences: list[Annotated[bool, Field(strict=True)]] = Field(default_factory=lambda: [False], min_length=1)
    dtypes: list[DtypeName] = Field(min_length=1)
    kernels: Literal["all"] | list[str] = "all"
    budget: Budget = Budget()
    tolerances: dict[DtypeName, Tolerance] = Field(default_factory=dict)


class ResolvedModel(_Strict):
    """A model after presets and TP: the dims one GPU sees."""

    name: str
    tp: int
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    chunk_size: int
    batch: list[int]
    seqlen: list[int]


class Spec(_Strict):
    name: str
    path: str
    sha256: str
    target: Target
    models: list[ResolvedModel]
    packed_sequences: list[bool] = [False]
    dtypes: list[DtypeName]
    kernels: list[str]
    budget: Budget
    tolerances: dict[str, Tolerance]


# --- YAML with line numbers ------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (PyYAML silently keeps the last)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key].start_mark.line + 1})", key_node.start_mark
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _node_line(root: yaml.Node | None, path: tuple[Any, ...]) -> int:
    """1-based line of the deepest node reachable along `path` (a pydantic loc)."""
    node = root
    line = (root.start_mark.line + 1) if root is not None else 1
    for part in path:
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == str(part):
                    # Point at the key for mappings/sequences, at the value for scalars.
                    nxt = v
                    line = (v.start_mark.line if isinstance(v, yaml.ScalarNode) else k.start_mark.line) + 1
                    break
            if nxt is None:
                return line
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _loc_text(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<spec>"


def _pydantic_message(err: dict[str, Any]) -> str:
    kind, msg = err["type"], err["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"{msg} (got {err.get('input')!r})"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"{msg} (got {type(err.get('input')).__name__} {err.get('input')!r})"
    return msg


def load_spec(path: str | Path) -> Spec:
    """Read, validate and resolve a spec; raise SpecError with one line on any problem."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError(f"{p}: cannot read: {e.strerror}") from None
    return parse_spec(text, source=str(p), stem=p.stem)


def parse_spec(text: str, *, source: str = "<spec>", stem: str = "spec") -> Spec:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise SpecError(f"{source}:{line}: invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{source}: invalid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{source}:1: a spec is a YAML mapping, got {type(data).__name__}")

    def fail(loc: tuple[Any, ...], message: str) -> SpecError:
        return SpecError(f"{source}:{_node_line(root, loc)}: {_loc_text(loc)}: {message}")

    try:
        model = SpecModel.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        raise fail(tuple(err["loc"]), _pydantic_message(err)) from None
    return _resolve(model, text, source, stem, fail)


def _resolve(model: SpecModel, text: str, source: str, stem: str, fail: Any) -> Spec:
    from autotune_cli.kernel_keys import all_keys

    target = model.target
    sku = GPU_SKUS[target.gpu]
    if target.arch is not None and target.arch != sku.arch:
        raise fail(("target", "arch"), f"{target.gpu} is {sku.arch}, not {target.arch}")

    resolved: list[ResolvedModel] = []
    seen_names: dict[str, int] = {}
    for i, m in enumerate(model.models):
        loc = ("models", i)
        if (m.preset is None) == (m.dims is None):
            raise fail(loc, "give exactly one of 'preset' or 'dims'")
        if m.preset is not None:
            if m.preset not in MODEL_PRESETS:
                raise fail((*loc, "preset"), f"unknown preset {m.preset!r}; known: {', '.join(MODEL_PRESETS)}")
            dims: ModelDims = MODEL_PRESETS[m.preset]
            name = m.name or m.preset
        else:
            d = m.dims
            assert d is not None
            if m.name is None:
                raise fail(loc, "a model with explicit 'dims' needs a 'name'")
            nheads = d.nheads
            if d.d_inner is not None:
                if d.d_inner % d.headdim:
                    raise fail((*loc, "dims", "headdim"), f"headdim {d.headdim} does not divide d_inner {d.d_inner}")
                if nheads is not None and nheads * d.headdim != d.d_inner:
                    raise fail((*loc, "dims", "d_inner"),
                               f"d_inner {d.d_inner} != nheads {nheads} * headdim {d.headdim}")
                nheads = d.d_inner // d.headdim
            if nheads is None:
                raise fail((*loc, "dims"), "give 'nheads' or 'd_inner'")
            if nheads % d.ngroups:
                raise fail((*loc, "dims", "ngroups"), f"ngroups {d.ngroups} does not divide nheads {nheads}")
            dims = ModelDims(d_model=d.d_model or 0, nheads=nheads, headdim=d.headdim,
                             ngroups=d.ngroups, dstate=d.dstate, chunk_size=d.chunk_size)
            name = m.name
        if name in seen_names:
            raise fail((*loc, "name"), f"model name {name!r} already used by models[{seen_names[name]}]")
        seen_names[name] = i
        for j, tp in enumerate(m.tp):
            if dims.nheads % tp or dims.ngroups % tp:
                raise fail((*loc, "tp", j),
                           f"tp {tp} must divide nheads {dims.nheads} and ngroups {dims.ngroups}")
        if len(set(m.tp)) != len(m.tp):
            raise fail((*loc, "tp"), f"duplicate tp degrees {m.tp}")
        for tp in m.tp:
            resolved.append(ResolvedModel(
                name=name, tp=tp, nheads=dims.nheads // tp, headdim=dims.headdim, ngroups=dims.ngroups // tp,
                dstate=dims.dstate, chunk_size=dims.chunk_size,
                batch=list(m.batch or model.batch), seqlen=list(m.seqlen or model.seqlen),
            ))

    known = all_keys()
    if model.kernels == "all":
        kernels = list(known)
    else:
        kernels = []
        for i, k in enumerate(model.kernels):
            if k not in known:
                raise fail(("kernels", i), f"unknown kernel {k!r}; known: {', '.join(known)}")
            if k in kernels:
                raise fail(("kernels", i), f"kernel {k!r} listed twice")
            kernels.append(k)
        if not kernels:
            raise fail(("kernels",), "no kernels listed (use 'all' or name at least one)")
    if len(set(model.dtypes)) != len(model.dtypes):
        raise fail(("dtypes",), f"duplicate dtypes {model.dtypes}")
    if len(set(model.packed_sequences)) != len(model.packed_sequences):
        raise fail(("packed_sequences",), f"duplicate values {model.packed_sequences}")

    tolerances = {**DEFAULT_TOLERANCES, **model.tolerances}
    return Spec(
        name=model.name or stem,
        path=source,
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        target=target,
        models=resolved,
        packed_sequences=list(model.packed_sequences),
        dtypes=list(model.dtypes),
        kernels=kernels,
        budget=model.budget,
        tolerances=tolerances,
    )
