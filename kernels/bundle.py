"""Config bundle format v1: validated JSON, never executable code.

A bundle holds the tuned Helion configs of one sweep on one GPU. The CLI writes it
(`mamba-tune sweep`), reviews it (`diff`, `check`, `verify`) and the kernels load it at
run time (`mamba_tune.runtime`). This module is the single definition of the format, so it
depends on pydantic and the standard library only (no torch, no helion). A config's values
are checked on every load (`mamba_tune.config_schema`): Helion turns some of them into code.

Layout (keys sorted, two-space indent, lists of scalars on one line, so that a
`git diff` of a bundle shows one block per changed entry):

    {
      "entries": {"<kernel>|<dim>=<v>,...|<dtype>": Entry, ...},
      "failures": {"<same key form>": Failure, ...},
      "provenance": Provenance,
      "schema_version": 1
    }
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from mamba_tune.config_schema import schema_problem
from mamba_tune.vocab import DtypeName

SCHEMA_VERSION = 1
# A bundle is a few hundred entries at most; anything this big is not one (or is /dev/zero).
MAX_BUNDLE_BYTES = 64 << 20


class BundleError(ValueError):
    """A bundle that cannot be used; the message is one line naming the file and the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuInfo(_Model):
    name: str = Field(description="torch.cuda.get_device_name(), e.g. 'NVIDIA H200'")
    sku: str = Field(description="short SKU used in paths and specs, e.g. 'h200'")
    arch: str = Field(description="'sm90' for compute capability 9.0")
    compute_capability: str = Field(description="'9.0'")
    sm_count: int


class Versions(_Model):
    helion: str
    torch: str
    triton: str
    cuda: str | None = None
    driver: str | None = None
    python: str


class SpecRef(_Model):
    name: str
    path: str
    sha256: str


class KernelProvenance(_Model):
    source_sha256: str = Field(description="sha256 of the Helion kernel's source text")
    config_spec_fingerprint: str | None = Field(
        default=None, description="bundles before the per-entry field (Search.config_spec_fingerprint): one "
        "entry's config space, though a kernel's entries can have several (packed and unpacked calls differ)"
    )


class Provenance(_Model):
    tool_version: str
    git_sha: str | None = None
    created: str
    updated: str
    gpu: GpuInfo
    versions: Versions
    spec: SpecRef | None = None
    kernels: dict[str, KernelProvenance] = Field(default_factory=dict)


class Timing(_Model):
    tuned_ms: float
    default_ms: float
    baseline_ms: float | None = None
    baseline: str | None = Field(default=None, description="what baseline_ms timed, e.g. 'mamba-ssm 2.3.2.post1'")
    gbps: float | None = Field(default=None, description="achieved GB/s of the tuned config (memory-bound kernels)")
    tflops: float | None = Field(default=None, description="achieved TFLOP/s of the tuned config")


class Speedup(_Model):
    vs_default: float
    vs_baseline: float | None = None


class Search(_Model):
    algorithm: str
    effort: str
    configs_tried: int | None = None
    seconds: float
    seed: int
    seed_configs: int = Field(0, description="hand-picked starting configs given to the search")
    budget_seconds: int | None = None
    max_generations: int | None = None
    trace: list[tuple[float, float]] | None = Field(
        None, description="best so far: [seconds into the search, best ms] at each config that beat every "
        "earlier one, from Helion's autotune log (absent: no search ran, or a bundle from before this field)")
    config_spec_fingerprint: str | None = Field(
        None, description="Helion ConfigSpec.structural_fingerprint_hash() of the config space this entry was "
        "tuned in (absent: a bundle from before this field)")
    adopted_from: str | None = Field(
        None, pattern=r"^[a-z0-9][a-z0-9-]{0,63}$", description="the sibling SKU (e.g. 'h200') whose entry's config "
        "this one took without a search (`sweep --adopt-sibling`), after checking and timing it on this GPU; absent: "
        "the config is this GPU's own search's")

    @model_serializer(mode="wrap")
    def _no_empty_trace(self, handler: Any) -> Any:
        # Written only where there is one: an entry without them stays as bundles were
        # before the fields existed (readable by older mamba-tune, no churn in diffs).
        data = handler(self)
        if isinstance(data, dict):
            for name in ("trace", "config_spec_fingerprint", "adopted_from"):
                if data.get(name) is None:
                    data.pop(name, None)
        return data


class Accuracy(_Model):
    passed: bool
    atol: float
    factor: float
    max_abs_err: dict[str, float] = Field(description="kernel vs fp32 reference, per output")
    lowp_abs_err: dict[str, float] = Field(description="eager torch in the same dtype vs fp32 reference")
    bound: dict[str, float] = Field(description="factor * lowp_abs_err + atol, per output")


class Entry(_Model):
    kernel: str
    dims: dict[str, int]
    dtype: DtypeName
    config: dict[str, Any]
    timing: Timing
    speedup: Speedup
    search: Search
    accuracy: Accuracy
    tuned_at: str

    @field_validator("config")
    @classmethod
    def _safe_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        # Helion turns some config values into code: only checked data gets this far.
        if (bad := schema_problem(config)) is not None:
            raise ValueError(bad)
        return config

    @property
    def key(self) -> str:
        return entry_key(self.kernel, self.dims, self.dtype)


class Failure(_Model):
    kernel: str
    dims: dict[str, int]
    dtype: DtypeName
    reason: str
    at: str


class Bundle(_Model):
    schema_version: Literal[1] = SCHEMA_VERSION
    provenance: Provenance
    entries: dict[str, Entry] = Field(default_factory=dict)
    failures: dict[str, Failure] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _keys_match(self) -> Bundle:
        for where in ("entries", "failures"):
            for key, item in getattr(self, where).items():
                want = entry_key(item.kernel, item.dims, item.dtype)
                if key != want:
                    raise ValueError(f"{where}[{key!r}]: key does not match its fields (expected {want!r})")
        for key, entry in self.entries.items():
            if entry.search.adopted_from == self.provenance.gpu.sku:
                raise ValueError(f"entries[{key!r}].search.adopted_from: {entry.search.adopted_from!r} is the SKU the "
                                 "bundle was tuned on; an entry adopts a sibling SKU's config")
            if not entry.accuracy.passed:
                raise ValueError(f"entries[{key!r}]: accuracy.passed is false; a failed config is a failure, not an entry")
            for part in ("timing", "speedup"):
                for name, value in getattr(entry, part).model_dump().items():
                    if isinstance(value, float) and not (math.isfinite(value) and value > 0):
                        raise ValueError(f"entries[{key!r}].{part}.{name}: must be a positive finite number, "
                                         f"got {value}")
        return self

    def with_entry(self, entry: Entry, *, updated: str) -> Bundle:
        entries = dict(self.entries)
        entries[entry.key] = entry
        failures = {k: v for k, v in self.failures.items() if k != entry.key}
        prov = self.provenance.model_copy(update={"updated": updated})
        return self.model_copy(update={"entries": entries, "failures": failures, "provenance": prov})

    def with_failure(self, failure: Failure, *, updated: str) -> Bundle:
        failures = dict(self.failures)
        key = entry_key(failure.kernel, failure.dims, failure.dtype)
        failures[key] = failure
        prov = self.provenance.model_copy(update={"updated": updated})
        return self.model_copy(update={"failures": failures, "provenance": prov})


def entry_key(kernel: str, dims: dict[str, int], dtype: str) -> str:
    """`kernel|d1=v1,d2=v2|dtype` with the dims sorted by name (the file's key order too)."""
    return f"{kernel}|{','.join(f'{k}={dims[k]}' for k in sorted(dims))}|{dtype}"


def parse_key(key: str) -> tuple[str, dict[str, int], str]:
    try:
        kernel, dims_text, dtype = key.split("|")
        dims = {k: int(v) for k, v in (item.split("=") for item in dims_text.split(",") if item)}
    except ValueError as e:
        raise BundleError(f"malformed entry key {key!r}: expected 'kernel|dim=int,...|dtype'") from e
    return kernel, dims, dtype


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in e["loc"]).replace(".[", "[")
    msg = e["msg"].removeprefix("Value error, ")
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{loc or '<root>'}: {msg}{more}"


class _DuplicateKey(ValueError):
    pass


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of duplicate keys silently; a bundle with two values for one key
    # was edited by hand or merged badly, and either value may be the wrong one.
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    # NaN and Infinity are not JSON (RFC 8259), and a timing or speedup of NaN means nothing.
    raise ValueError(f"{name} is not a JSON number")


def _non_finite(data: Any) -> tuple[str, float] | None:
    """The path and value of the first non-finite float in parsed JSON, or None."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return where or "<root>", v
        if isinstance(v, dict):
            stack.extend((f"{where}.{k}" if where else str(k), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", x) for i, x in enumerate(v))
    return None


def json_error_text(source: str, e: json.JSONDecodeError) -> str:
    """One line for JSON that does not parse: file, line and column, what was expected there,
    and whether the file ends early (a truncated copy). json's own message for a string never
    closed stops at "starting at" (the position is in its str(), not its msg)."""
    what = e.msg
    if what == "Unterminated string starting at":
        what = "expecting '\"' to close the string that starts here"
    elif what.startswith("Expecting"):
        what = "expecting" + what.removeprefix("Expecting")
    if e.pos >= len(e.doc.rstrip()) or what.startswith("expecting '\"' to close"):
        what += " (the file ends before it: truncated?)"
    return f"{source}:{e.lineno}:{e.colno}: not valid JSON: {what}"


def _bad_configs(data: dict[str, Any], source: str) -> list[tuple[str, str]]:
    """(entry key, one line naming `source`, the key and the config field) for each entry whose
    config the schema refuses (`mamba_tune.config_schema`)."""
    entries = data.get("entries")
    if not isinstance(entries, dict):
        return []
    bad = []
    for key, entry in entries.items():
        if isinstance(entry, dict) and "config" in entry and (why := schema_problem(entry["config"])) is not None:
            bad.append((key, f"{source}: entries[{key!r}].config.{why}"))
    return bad


def parse_bundle(text: str, *, source: str = "<bundle>",
                 skip_bad_config: Callable[[str], None] | None = None) -> Bundle:
    """Parse and validate a bundle; raise BundleError with one line naming `source` and the field.

    An entry whose config holds a value no Helion config may hold (`config_schema`) fails the
    bundle, unless `skip_bad_config` is given (the run-time loader): then that entry is left
    out and `skip_bad_config` gets its one line, and the bundle's other entries stay usable."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_object, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise BundleError(json_error_text(source, e)) from None
    except _DuplicateKey as e:
        raise BundleError(f"{source}: duplicate key {str(e)[:200]!r} in one JSON object") from None
    except ValueError as e:
        raise BundleError(f"{source}: not valid JSON: {e}") from None
    except RecursionError:
        raise BundleError(f"{source}: nested too deeply to be a bundle") from None
    if not isinstance(data, dict):
        raise BundleError(f"{source}: a bundle is a JSON object, got {type(data).__name__}")
    if (bad := _non_finite(data)) is not None:
        raise BundleError(f"{source}: {bad[0]}: {bad[1]} is not a finite number (JSON reads 1e400 as infinity)")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BundleError(
            f"{source}: schema_version {version!r} is not supported (this mamba-tune reads {SCHEMA_VERSION})"
        )
    if bad := _bad_configs(data, source):
        if skip_bad_config is None:
            raise BundleError(bad[0][1] + (f" (+{len(bad) - 1} more entries)" if len(bad) > 1 else ""))
        for key, line in bad:
            skip_bad_config(line)
            del data["entries"][key]
    try:
        return Bundle.model_validate(data)
    except ValidationError as e:
        raise BundleError(f"{source}: {_first_error(e)}") from None


def load_bundle(path: str | os.PathLike[str], *, skip_bad_config: Callable[[str], None] | None = None) -> Bundle:
    """Read and validate a bundle. Every problem with the file (unreadable, not UTF-8, not
    JSON, too deep, invalid) is a BundleError with one line: the run-time loader warns and
    skips on it, so nothing about a bundle file can raise into a training job. With
    `skip_bad_config`, an entry with a bad config is skipped instead (see parse_bundle)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_BUNDLE_BYTES + 1)
    except OSError as e:
        raise BundleError(f"{p}: cannot read: {e.strerror or e}") from None
    except ValueError as e:  # e.g. a NUL byte in the path
        raise BundleError(f"{p!r}: cannot read: {e}") from None
    if len(raw) > MAX_BUNDLE_BYTES:
        raise BundleError(f"{p}: over {MAX_BUNDLE_BYTES >> 20} MiB; not a bundle (the largest shipped one is 50 KB)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise BundleError(f"{p}:{line}: not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r})") from None
    return parse_bundle(text, source=str(p), skip_bad_config=skip_bad_config)


def _dump(value: Any, indent: int) -> str:
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f'{pad}  {json.dumps(str(k))}: {_dump(value[k], indent + 1)}' for k in sorted(value)]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list):
        # Lists of scalars stay on one line: Helion configs are full of short int lists.
        if all(not isinstance(v, (dict, list)) for v in value) or all(
            isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v) for v in value
        ):
            return json.dumps(value, separators=(", ", ": "))
        items = [f"{pad}  {_dump(v, indent + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    if isinstance(value, float) and not math.isfinite(value):
        raise BundleError(f"cannot write non-finite number {value} to a bundle")
    return json.dumps(value)


def dumps_bundle(bundle: Bundle) -> str:
    return _dump(bundle.model_dump(mode="json"), 0) + "\n"


def write_bundle(bundle: Bundle, path: str | os.PathLike[str]) -> None:
    """Write atomically (see write_text_atomic), after checking that the text reads back."""
    text = dumps_bundle(bundle)
    parse_bundle(text, source=str(path))  # never write what we could not read back
    write_text_atomic(path, text)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """A temp file in the same folder, fsync, os.replace, fsync of the folder: readers see the
    old file or the new, and after a crash the folder holds one of them. The file gets the
    mode a plain `open` would give (0666 less the umask), so that other users' training jobs
    can read a bundle where the umask allows it (mkstemp alone makes it 0600)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(p), suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(p.parent)


def temp_prefix(path: Path) -> str:
    """The name prefix of `path`'s temp files (`.NAME.`, suffix `.tmp`): what a killed write leaves."""
    return f".{path.name}."


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc/self/status);
    elsewhere set and restored at once (os.umask can only read by writing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (POSIX: the folder's entry is data of the folder)."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def find_bundles(paths: list[Path]) -> list[Path]:
    """The bundles of the given files and folders, sorted (the order ties are broken in). Bundles
    live at <root>/<sku>/<name>.json: a folder is read at that depth and the one above it (a SKU's
    folder given itself), never deeper, so a root such as / costs two directory levels, not a
    walk of the disk."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = [*p.glob("*.json"), *p.glob("*/*.json")]
            out.extend(sorted(q for q in found if not q.name.startswith(".")))
        elif p.suffix == ".json":
            out.append(p)
    return out
