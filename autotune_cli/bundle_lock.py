"""A bundle's one lock, `<bundle>.lock` (a real file lock, filelock): whoever writes the
bundle holds it. A sweep holds it for its whole run (it rewrites the bundle after every
combo), a Slurm task while it merges its result, `mamba-tune merge -o` while it writes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout


class BundleBusy(Timeout):
    """Another process holds the bundle's lock (a sweep writing it)."""

    def __init__(self, bundle: Path) -> None:
        super().__init__(f"{bundle}.lock")
        self.bundle = bundle

    def __str__(self) -> str:
        return f"another sweep is writing {self.bundle} (lock {self.bundle}.lock is held)"


def lock_path(bundle: Path) -> Path:
    return bundle.with_name(f"{bundle.name}.lock")


@contextlib.contextmanager
def bundle_lock(bundle: Path, timeout: float = 0) -> Iterator[None]:
    """Hold `<bundle>.lock` for the block; BundleBusy after `timeout` seconds (0: at once).

    A lock file that cannot be created (a read-only or missing folder) is the OSError of
    creating it, at once: filelock itself retries some of those errors until its timeout."""
    path = lock_path(bundle)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.close(fd)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        raise BundleBusy(bundle) from None
    try:
        yield
    finally:
        lock.release()
