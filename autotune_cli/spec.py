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
    norm_weight_dtypes: [fp32, bf16]     # optional, default [fp32]: the gated norm's weight dtypes;
                                         #   fp32, or one of dtypes (a module built in that dtype)
    kernels: all                         # every kernel a layer runs, or a list of names (mamba-tune plan lists them)
    budget:
      effort: quick                      # Helion effort: none | quick | full
      seconds_per_combo: 300             # cap on the search's wall time (optional)
      algorithm: LFBOTreeSearch          # a Helion search algorithm
      max_generations: null              # optional cap on generations
      seed: 0                            # autotuner random seed
    tolerances:                          # per dtype; a config passes when, per output,
      bf16: {atol: 0.01, factor: 2.0}    #   err(kernel) <= factor * err(eager torch in dtype) + atol
    shipped:                             # optional: the part of this sweep each committed bundle
      h200: {tp: [1], seqlen: [8192]}    #   holds, per SKU of the target's arch (`plan --shipped
      h100:                              #   --gpu SKU`, `check --shipped --gpu SKU`); each key
        tp: [1]                          #   narrows the sweep's list of the same name: tp, batch,
        kernels: [gated_norm_fwd]        #   seqlen, packed_sequences, dtypes, norm_weight_dtypes, kernels
                                         #   (or flat, `shipped: {tp: [1]}`: the target's part)

A spec is one whole sweep per model: `plan`, `sweep` and `check` take all of it. Its `shipped`
section names the part of it that the bundle of each SKU in the repository holds today
(generated_configs/<sku>/), so that CI can check that part (`mamba-tune check SPEC --shipped
--gpu SKU`) while running the spec extends the bundle; a value there that the sweep does not
have is an error (autotune_cli/shipped.py).

`plan` and `check` read a spec for another SKU of its target's arch with `--gpu SKU`
(`load_spec(path, gpu=SKU)`): the same sweep, retargeted to SKU, with SKU's shipped part.

Names (the spec's `name`, and `tune --name`) become file names (OUT/<sku>/<name>.json,
its lock and its log folder), so they must match `limits.SAFE_NAME`: 1-100 characters from
A-Z a-z 0-9 . _ -, starting with a letter or digit (no path separators, no `..`, no NUL).
Dims the kernels cannot run are rejected here (`limits.dims_problem`), not in a worker: chunk_size a power of two
in 16..256, headdim and dstate at most 256, and no tensor of a combo over 2**31 - 1
elements (the kernels index with int32). Input limits: a spec is at most 1 MiB of UTF-8,
nested at most 32 levels, and expands to at most 10,000 YAML nodes once aliases are
followed (anchors and aliases work; an alias bomb is refused, never expanded).
"""

from __future__ import annotations

import difflib
import hashlib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autotune_cli.limits import dims_problem, name_problem
from autotune_cli.presets import MODEL_PRESETS, SEARCH_ALGORITHMS, ModelDims
from mamba_tune.sku import GPU_SKUS
from mamba_tune.vocab import DtypeName

Effort = Literal["none", "quick", "full"]
PosInt = Annotated[int, Field(gt=0, strict=True)]

MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_DEPTH = 32
MAX_SPEC_NODES = 10_000


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

    @field_validator("headdim", "dstate", "chunk_size")
    @classmethod
    def _runnable(cls, v: int, info: Any) -> int:
        if why := dims_problem({info.field_name: v}):
            raise ValueError(why)
        return v


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

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str | None) -> str | None:
        if v is not None and (why := name_problem(v)):
            raise ValueError(why)
        return v

    description: str | None = None
    target: Target
    models: list[ModelEntry] = Field(min_length=1)
    batch: list[PosInt] = Field(min_length=1)
    seqlen: list[PosInt] = Field(min_length=1)
    packed_sequences: list[Annotated[bool, Field(strict=True)]] = Field(default_factory=lambda: [False], min_length=1)
    dtypes: list[DtypeName] = Field(min_length=1)
    norm_weight_dtypes: list[DtypeName] = Field(default_factory=lambda: ["fp32"], min_length=1)
    kernels: Literal["all"] | list[str] = "all"
    budget: Budget = Budget()
    tolerances: dict[DtypeName, Tolerance] = Field(default_factory=dict)
    # Parsed once the sweep is resolved (autotune_cli.shipped): its lists narrow the sweep's.
    shipped: dict[Any, Any] | None = None


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
    # The gated norm's weight dtypes: "fp32", or a dtype of `dtypes` (the weight in the
    # inputs' dtype, weight_fp32=0 in the key: a module built in that dtype).
    norm_weight_dtypes: list[DtypeName] = ["fp32"]
    kernels: list[str]
    budget: Budget
    tolerances: dict[str, Tolerance]
    # The SKUs the spec's `shipped` section names a part for (the target's alone in its flat form).
    shipped_skus: list[str] = []


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


def _short(text: str, limit: int = 120) -> str:
    """One line of at most `limit` characters (a bad input value can be huge)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field's annotation holds (itself, or in a list / Optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _model_in(arg)) is not None:
            return found
    return None


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys the spec allows beside the last element of `loc` (empty where unknown)."""
    cls: type[BaseModel] | None = SpecModel
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(part) if cls is not None else None
        if field is None:
            return []
        cls = _model_in(field.annotation)
    return list(cls.model_fields) if cls is not None else []


def _unknown_key_message(loc: tuple[Any, ...]) -> str:
    key = str(loc[-1])
    known = _keys_at(loc)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return f"unknown key {key!r}; did you mean {close[0]!r}?"
    return f"unknown key {key!r}" + (f"; known keys here: {', '.join(known)}" if known else "")


def _pydantic_message(err: dict[str, Any]) -> str:
    kind, msg = err["type"], err["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return _unknown_key_message(tuple(err["loc"]))
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"{msg} (got {_short(repr(err.get('input')), 60)})"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"{msg} (got {type(err.get('input')).__name__} {_short(repr(err.get('input')), 60)})"
    return _short(msg, 300)


def load_spec(path: str | Path, *, shipped: bool = False, gpu: str | None = None) -> Spec:
    """Read, validate and resolve a spec; raise SpecError with one line on any problem. With
    `gpu` (a SKU of the target's arch), the spec retargeted to that SKU. With `shipped`, the part
    of the sweep its `shipped` section names for that SKU (an error if it names none)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except OSError as e:
        raise SpecError(f"{p}: cannot read: {e.strerror or e}") from None
    except ValueError as e:  # e.g. a NUL byte in the path
        raise SpecError(f"{p!r}: cannot read: {e}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(f"{p}: over {MAX_SPEC_BYTES >> 20} MiB; a spec is a short YAML file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise SpecError(f"{p}:{line}: not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r})") from None
    return parse_spec(text, source=str(p), stem=p.stem, shipped=shipped, gpu=gpu)


def _check_size(root: yaml.Node, source: str) -> None:
    """Refuse deep nesting and alias bombs before anything walks the tree: count nodes as
    if every alias were expanded (an alias is the anchored node itself in PyYAML's graph)."""
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    count = 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_SPEC_DEPTH:
            raise SpecError(f"{source}:{node.start_mark.line + 1}: nested deeper than {MAX_SPEC_DEPTH} levels")
        if count > MAX_SPEC_NODES:
            raise SpecError(f"{source}: over {MAX_SPEC_NODES:,} YAML nodes once aliases are expanded "
                            "(an alias bomb?); a spec is small")
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.extend(((k, depth + 1), (v, depth + 1)))


def parse_spec(text: str, *, source: str = "<spec>", stem: str = "spec", shipped: bool = False,
               gpu: str | None = None) -> Spec:
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(f"{source}: over {MAX_SPEC_BYTES >> 20} MiB; a spec is a short YAML file")
    loader: _UniqueKeyLoader | None = None
    try:
        loader = _UniqueKeyLoader(text)  # a SafeLoader: no arbitrary objects
        root = loader.get_single_node()
        if root is not None:
            _check_size(root, source)
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise SpecError(f"{source}:{line}: invalid YAML: {_short(str(e.problem or e.context))}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{source}: invalid YAML: {_short(' '.join(str(e).split()))}") from None
    except RecursionError:
        # PyYAML's composer recurses per nesting level: far too deep for a spec.
        raise SpecError(f"{source}: nested deeper than {MAX_SPEC_DEPTH} levels") from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict):
        raise SpecError(f"{source}:1: a spec is a YAML mapping, got {type(data).__name__}")

    def fail(loc: tuple[Any, ...], message: str) -> SpecError:
        return SpecError(f"{source}:{_node_line(root, loc)}: {_loc_text(loc)}: {message}")

    try:
        model = SpecModel.model_validate(data)
    except ValidationError as e:
        # An unknown key first: a typo in a required key (`bacth`) is also reported as that key
        # missing, and the typo is what to fix.
        err = min(e.errors(), key=lambda x: x["type"] != "extra_forbidden")
        raise fail(tuple(err["loc"]), _pydantic_message(err)) from None
    spec = _resolve(model, text, source, stem, fail)
    sku = spec.target.gpu if gpu is None else gpu
    if why := gpu_problem(spec.target, sku):
        raise SpecError(f"{source}: --gpu {why}")
    # The shipped parts are checked whenever the spec is read, so `validate` catches a bad one.
    parts: dict[str, Spec] = {}
    if model.shipped is not None:
        from autotune_cli.shipped import shipped_parts

        parts = shipped_parts(model.shipped, spec, fail, _pydantic_message)
    spec = spec.model_copy(update={"shipped_skus": list(parts)})
    if shipped:
        if sku not in parts:
            has = f"it has a part for {', '.join(parts)} only" if parts else "it has no 'shipped' section"
            raise SpecError(f"{source}: no 'shipped' section for {sku} ({has}): it names the part of the sweep "
                            f"the committed bundle of {sku} holds (see autotune_cli/shipped.py)")
        spec = parts[sku].model_copy(update={"shipped_skus": list(parts)})
    if sku != spec.target.gpu:
        spec = spec.model_copy(update={"target": Target(gpu=sku, arch=spec.target.arch and GPU_SKUS[sku].arch)})
    return spec


def gpu_problem(target: Target, sku: str) -> str | None:
    """Why a spec for `target` cannot be read for GPU `sku` (`--gpu`): unknown, or of another arch."""
    arch = GPU_SKUS[target.gpu].arch
    same = ", ".join(s for s, g in GPU_SKUS.items() if g.arch == arch)
    if sku not in GPU_SKUS:
        return f"{sku!r}: unknown GPU SKU; known: {', '.join(GPU_SKUS)}"
    if GPU_SKUS[sku].arch != arch:
        return (f"{sku} is {GPU_SKUS[sku].arch}, but the spec targets {target.gpu} ({arch}); "
                f"give a SKU of {arch}: {same}")
    return None


def _resolve(model: SpecModel, text: str, source: str, stem: str, fail: Any) -> Spec:
    from mamba_tune.keys import all_keys

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
            r = ResolvedModel(
                name=name, tp=tp, nheads=dims.nheads // tp, headdim=dims.headdim, ngroups=dims.ngroups // tp,
                dstate=dims.dstate, chunk_size=dims.chunk_size,
                batch=list(m.batch or model.batch), seqlen=list(m.seqlen or model.seqlen),
            )
            for b in r.batch:
                for sl in r.seqlen:
                    shape = {"batch": b, "seqlen": sl, "nheads": r.nheads, "headdim": r.headdim,
                             "ngroups": r.ngroups, "dstate": r.dstate, "chunk_size": r.chunk_size}
                    if why := dims_problem(shape):
                        raise fail(loc, f"tp {tp} batch {b} seqlen {sl}: {why}")
            resolved.append(r)

    known = all_keys()
    if model.kernels == "all":
        # Every kernel (each form of a mamba_tune.paths choice runs at the shapes its rule picks it
        # for), but those no layer runs (`off_layer_dims`: the conv1d backward's two kernels), nor those
        # that run only inside another kernel's stage (`runs_too`: F2's kernel in the split state
        # passing backward), which come with that kernel at the shapes where it launches them.
        inside = {k for key in known.values() for k, _dims_for in key.runs_too}
        kernels = [k for k, key in known.items()
                   if k not in inside and key.off_layer_dims is None]
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
    for i, w in enumerate(model.norm_weight_dtypes):
        if w in model.norm_weight_dtypes[:i]:
            raise fail(("norm_weight_dtypes", i), f"{w} listed twice")
        if w != "fp32" and w not in model.dtypes:
            raise fail(("norm_weight_dtypes", i), f"{w} is neither fp32 nor one of dtypes {model.dtypes} "
                       "(a low-precision norm weight has the inputs' dtype)")
    for d in model.dtypes:
        if "fp32" not in model.norm_weight_dtypes and d not in model.norm_weight_dtypes:
            raise fail(("norm_weight_dtypes",), f"dtype {d} gets no norm weight dtype: list fp32 or {d}")

    if model.name is None and (why := name_problem(stem)):
        raise fail(("name",), f"no 'name' given and the file's stem {why}; add a 'name'")
    tolerances = {**DEFAULT_TOLERANCES, **model.tolerances}
    return Spec(
        name=model.name or stem,
        path=source,
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        target=target,
        models=resolved,
        packed_sequences=list(model.packed_sequences),
        dtypes=list(model.dtypes),
        norm_weight_dtypes=list(model.norm_weight_dtypes),
        kernels=kernels,
        budget=model.budget,
        tolerances=tolerances,
    )
