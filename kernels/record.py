"""Record what runs: every kernel key a process calls, how often, and how it was served.

    with mamba_tune.record_calls("calls.json"):
        train_step()

or, for a whole run, ``MAMBA_TUNE_RECORD=calls.json python train.py`` (the file is written
when the process exits). `mamba-tune sweep --from-record calls.json` then tunes the recorded
keys that had no exact entry.

The file (format ``mamba-tune-record``, version 1; JSON, keys sorted):

    {
      "format": "mamba-tune-record",
      "version": 1,
      "devices": ["NVIDIA H200"],            # devices the calls ran on ("cpu" in ref mode)
      "calls": {
        "gated_norm_fwd|d=4096,...|bf16": {  # the entry key, as in bundles
          "kernel": "gated_norm_fwd",
          "dims": {"d": 4096, ...},          # the kernel's key dims
          "dtype": "bf16",
          "calls": 240,                      # calls through the run-time lookup
          "served": {"exact": 200, "nearest gated_norm_fwd|...|bf16": 40}
        }
      }
    }

``served`` counts calls by how their config was chosen: ``exact`` (an entry of this key),
``nearest <key>`` (another shape's entry) or ``default`` (no entry: the kernel's default
config). An entry tuned on another SKU of the GPU's compute capability (the runtime's
fallback, `mamba_tune.store`) says so: ``exact (tuned on h200, running on h100)``, so that
`sweep --from-record` tunes its key for this SKU. In Helion ref mode (no GPU) no config applies; the record says what the run-time
rule would choose from the bundles (of any compute capability, since there is none).

Writing merges into an existing file (counts add up, devices join) under a file lock
(``<file>.lock``), then replaces it atomically, so several processes or ranks can record
into one file. Counts are of Python-level calls: a CUDA-graph replay does not call the
lookup and is not counted. With recording off, the run-time lookup pays one check of a
module global.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from mamba_tune import env, runtime

FORMAT = "mamba-tune-record"
VERSION = 1
ENV_RECORD = env.RECORD
# Other processes (ranks) hold a record's lock only while they merge into it: well under this.
LOCK_TIMEOUT_S = 120.0


class RecordError(ValueError):
    """A record file that cannot be read or merged into; one line naming the file."""


@dataclasses.dataclass(frozen=True)
class _Call:
    key: str
    kernel: str
    dims: dict[str, int]
    dtype: str
    served: str
    device: str


def served_text(res: runtime.Resolution) -> str:
    """How a call was served, without bundle paths: "exact", "nearest <key>" or "default",
    with "(tuned on h200, running on h100)" after an entry of a sibling SKU."""
    if res.config is None:
        return "default"
    how = "exact" if res.source.startswith("exact") else "nearest " + res.source.split()[1]
    return f"{how} ({res.sku_note})" if res.sibling else how


def _device_name(args: Sequence[Any]) -> str:
    gpu = runtime.gpu_of(args)
    if gpu is not None:
        return gpu.name
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device.type
    return "none"


class Recorder:
    """Counts calls per (kernel, signature); `flush` merges them into the file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        # (kernel name, signature) -> [calls since the last flush]; the hot path.
        self._counts: dict[tuple[Any, ...], list[int]] = {}
        # (kernel name, signature) -> what the call is; kept across flushes.
        self._calls: dict[tuple[Any, ...], _Call] = {}
        # Counts taken before `forget_resolutions`, not yet written.
        self._taken: list[tuple[_Call, int]] = []

    def count(self, rk: runtime.RuntimeKernel, args: Sequence[Any], k: tuple[Any, ...]) -> None:
        """One call (runtime.lookup calls this while recording)."""
        cell = self._counts.get(k)
        if cell is not None:
            cell[0] += 1
        else:
            self._first(rk, args, k)

    def _first(self, rk: runtime.RuntimeKernel, args: Sequence[Any], k: tuple[Any, ...]) -> None:
        with self._lock:
            if k not in self._calls:
                res = runtime.resolution_of(k) or runtime.resolve(rk, args)
                dims = rk.dims_from_args(args)
                self._calls[k] = _Call(key=res.key, kernel=rk.name, dims=dims, dtype=runtime.dtype_of(args, rk),
                                       served=served_text(res), device=_device_name(args))
            self._counts.setdefault(k, [0])[0] += 1

    def forget_resolutions(self) -> None:
        """`mamba_tune.configure` changed the bundles or mode: resolve each signature again."""
        with self._lock:
            self._taken += self._take()
            self._calls.clear()

    def _take(self) -> list[tuple[_Call, int]]:
        # Under self._lock: the counts since the last take, and start new ones.
        counts, self._counts = self._counts, {}
        return [(self._calls[k], cell[0]) for k, cell in counts.items()]

    def snapshot(self) -> dict[str, Any]:
        """The calls since the last flush, in the file's format (and forget them)."""
        with self._lock:
            taken, self._taken = self._taken + self._take(), []
        doc = empty_record()
        for call, n in taken:
            rec = doc["calls"].setdefault(call.key, {"kernel": call.kernel, "dims": call.dims, "dtype": call.dtype,
                                                     "calls": 0, "served": {}})
            rec["calls"] += n
            rec["served"][call.served] = rec["served"].get(call.served, 0) + n
            if call.device not in doc["devices"]:
                doc["devices"].append(call.device)
        doc["devices"].sort()
        return doc

    def flush(self) -> None:
        """Merge the calls since the last flush into the file (under its lock)."""
        doc = self.snapshot()
        if doc["calls"]:
            merge_into(self.path, doc)


def empty_record() -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "devices": [], "calls": {}}


def _check_int(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RecordError(f"{where}: expected a count >= 0, got {value!r}")
    return value


def parse_record(data: object, source: str) -> dict[str, Any]:
    """Check a record's structure (not its kernel names: the CLI checks those)."""
    if not isinstance(data, dict):
        raise RecordError(f"{source}: a record is a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise RecordError(f"{source}: not a {FORMAT} file (format {data.get('format')!r})")
    if data.get("version") != VERSION:
        raise RecordError(f"{source}: record version {data.get('version')!r}; this tool reads version {VERSION}")
    devices, calls = data.get("devices"), data.get("calls")
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        raise RecordError(f"{source}: 'devices' must be a list of device names")
    if not isinstance(calls, dict):
        raise RecordError(f"{source}: 'calls' must be an object of entry key -> call record")
    from mamba_tune.bundle import entry_key

    for key, rec in calls.items():
        where = f"{source}: calls[{key!r}]"
        if not isinstance(rec, dict) or set(rec) != {"kernel", "dims", "dtype", "calls", "served"}:
            raise RecordError(f"{where}: expected the keys calls, dims, dtype, kernel, served")
        dims = rec["dims"]
        if not isinstance(dims, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                 for v in dims.values()):
            raise RecordError(f"{where}.dims: expected an object of dim name -> int")
        if not isinstance(rec["kernel"], str) or not isinstance(rec["dtype"], str):
            raise RecordError(f"{where}: kernel and dtype must be strings")
        if entry_key(rec["kernel"], dims, rec["dtype"]) != key:
            raise RecordError(f"{where}: key does not match kernel, dims and dtype "
                              f"({entry_key(rec['kernel'], dims, rec['dtype'])})")
        total = _check_int(rec["calls"], f"{where}.calls")
        served = rec["served"]
        if not isinstance(served, dict):
            raise RecordError(f"{where}.served: expected an object of how served -> calls")
        if sum(_check_int(n, f"{where}.served[{s!r}]") for s, n in served.items()) != total:
            raise RecordError(f"{where}: served counts do not add up to calls {total}")
    return data


def load_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a record file; RecordError (one line) on any problem."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise RecordError(f"{p}: cannot read: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        from mamba_tune.bundle import json_error_text

        raise RecordError(json_error_text(str(p), e)) from None
    return parse_record(data, str(p))


def merge(into: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`into` plus `new` (both checked records): counts add up, devices join."""
    out = json.loads(json.dumps(into))
    for device in new["devices"]:
        if device not in out["devices"]:
            out["devices"].append(device)
    out["devices"].sort()
    for key, rec in new["calls"].items():
        old = out["calls"].setdefault(key, {**rec, "calls": 0, "served": {}})
        old["calls"] += rec["calls"]
        for served, n in rec["served"].items():
            old["served"][served] = old["served"].get(served, 0) + n
    return out


def merge_into(path: Path, doc: dict[str, Any]) -> None:
    """Add `doc` to the record at `path` (created if absent) under `<path>.lock`."""
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    _check_lock_file(path)
    lock = FileLock(f"{path}.lock")
    try:
        lock.acquire(timeout=LOCK_TIMEOUT_S)
    except Timeout:
        raise RecordError(f"{path}: its lock {path}.lock was held for over {LOCK_TIMEOUT_S:.0f} s") from None
    try:
        merged = merge(load_record(path), doc) if path.exists() else doc
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(merged, f, indent=2, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    finally:
        lock.release()


def _check_lock_file(path: Path) -> None:
    """RecordError at once where `<path>.lock` cannot be created (a read-only or a special
    folder such as /proc): filelock retries some of those errors for as long as it waits."""
    lock = f"{path}.lock"
    try:
        os.close(os.open(lock, os.O_RDWR | os.O_CREAT, 0o644))
    except OSError as e:
        raise RecordError(f"{path}: cannot create its lock file {lock}: {e.strerror or e}") from None


def start(path: str | os.PathLike[str]) -> Recorder:
    """Start recording into `path`; one recorder at a time."""
    current = runtime.recorder()
    if current is not None:
        raise RuntimeError(f"already recording kernel calls to {current.path}")
    rec = Recorder(path)
    runtime.set_recorder(rec)
    return rec


def stop(rec: Recorder) -> None:
    """Stop recording and write what was recorded."""
    if runtime.recorder() is rec:
        runtime.set_recorder(None)
    rec.flush()


@contextlib.contextmanager
def record_calls(path: str | os.PathLike[str]) -> Iterator[Recorder]:
    """Record every kernel call in the block into `path` (merged into an existing record)."""
    rec = start(path)
    try:
        yield rec
    finally:
        stop(rec)


def _flush_at_exit(rec: Recorder) -> None:
    try:
        stop(rec)
    except Exception as e:  # at exit, a warning rather than a traceback
        warnings.warn(f"mamba-tune: could not write the kernel call record {rec.path}: {e}",
                      runtime.MambaTuneWarning, stacklevel=1)


def start_from_env() -> Recorder | None:
    """`MAMBA_TUNE_RECORD=FILE`: record the whole process, written at exit."""
    path = env.read(ENV_RECORD)
    if path is None or runtime.recorder() is not None:
        return None
    try:  # a file that cannot be written fails here, at import, not at exit
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RecordError(f"{ENV_RECORD}={path}: cannot create its folder: {e.strerror or e}") from None
    try:
        _check_lock_file(Path(path))
    except RecordError as e:
        raise RecordError(f"{ENV_RECORD}={e}") from None
    rec = start(path)
    atexit.register(_flush_at_exit, rec)
    return rec
