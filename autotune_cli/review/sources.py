"""Where review commands read bundles from: a file, a folder, or a git revision.

    generated_configs/h200/nemotron-nano.json        a bundle file
    generated_configs/h200                           every *.json below it, by relative path
    main:generated_configs/h200                      the same, as committed in `main`
    HEAD~1:generated_configs/h200/nemotron-nano.json one bundle as committed in HEAD~1

A local path that exists wins over the `REV:PATH` reading. Git sources are read with
`git cat-file` / `git ls-tree` in the current directory's repository; PATH after the
colon is relative to the repository root (as in `git show REV:PATH`).
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path, PurePosixPath
from typing import Literal

from mamba_tune.bundle import Bundle, BundleError, find_bundles, load_bundle, parse_bundle


class SourceError(ValueError):
    """A bundle source that cannot be read; the message is one line."""


SourceKind = Literal["file", "dir", "missing"]


@dataclasses.dataclass(frozen=True)
class BundleSet:
    label: str  # what the user gave, e.g. "main:generated_configs/h200"
    kind: SourceKind  # "missing": allowed to be absent (--missing-ok) and absent
    # Relative path (folder sources) or file name (file sources) -> bundle.
    bundles: dict[str, Bundle]


def _git(args: list[str], cwd: Path | None) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        raise SourceError(f"cannot run git: {e}") from None


def _git_text(args: list[str], cwd: Path | None, what: str) -> str:
    res = _git(args, cwd)
    if res.returncode != 0:
        msg = res.stderr.decode(errors="replace").strip().splitlines()
        raise SourceError(f"{what}: {msg[-1] if msg else 'git failed'}")
    return res.stdout.decode()


def _split_rev(text: str) -> tuple[str, str] | None:
    rev, sep, path = text.partition(":")
    if not sep or not rev:
        return None
    return rev, path.strip("/")


def _load_git(text: str, rev: str, path: str, cwd: Path | None, missing_ok: bool) -> BundleSet:
    if _git(["rev-parse", "--git-dir"], cwd).returncode != 0:
        raise SourceError(f"{text}: not a path, and {Path(cwd or '.').resolve()} is not in a git repository")
    if _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd).returncode != 0:
        raise SourceError(f"{text}: unknown git revision {rev!r}")
    obj = f"{rev}:{path}"
    res = _git(["cat-file", "-t", obj], cwd)
    kind = res.stdout.decode().strip() if res.returncode == 0 else ""
    if kind == "blob":
        blob = _git(["cat-file", "blob", obj], cwd)
        try:
            bundle = parse_bundle(blob.stdout.decode("utf-8"), source=text)
        except UnicodeDecodeError:
            raise SourceError(f"{text}: not a UTF-8 text file") from None
        except BundleError as e:
            raise SourceError(str(e)) from None
        return BundleSet(text, "file", {PurePosixPath(path).name: bundle})
    if kind == "tree":
        names = _git_text(["ls-tree", "-r", "-z", "--name-only", obj], cwd, text).split("\0")
        bundles: dict[str, Bundle] = {}
        for name in sorted(n for n in names if n.endswith(".json") and not PurePosixPath(n).name.startswith(".")):
            sub = f"{rev}:{path}/{name}" if path else f"{rev}:{name}"
            blob = _git(["cat-file", "blob", sub], cwd)
            try:
                bundles[name] = parse_bundle(blob.stdout.decode("utf-8"), source=sub)
            except UnicodeDecodeError:
                raise SourceError(f"{sub}: not a UTF-8 text file") from None
            except BundleError as e:
                raise SourceError(str(e)) from None
        return BundleSet(text, "dir", bundles)
    if missing_ok:
        return BundleSet(text, "missing", {})
    raise SourceError(f"{text}: path {path or '.'!r} does not exist in revision {rev!r} "
                      "(the path after ':' is relative to the repository root)")


def load_source(text: str, *, cwd: Path | None = None, missing_ok: bool = False) -> BundleSet:
    """Read a bundle file, a folder of bundles, or `REV:PATH` from git; SourceError on any problem.

    `missing_ok`: a path (or git path) that does not exist is an empty set instead of an
    error, e.g. the old side of a diff for a GPU SKU that `main` has no bundles for yet.
    """
    p = Path(text) if cwd is None or Path(text).is_absolute() else cwd / text
    if p.is_dir():
        bundles: dict[str, Bundle] = {}
        for f in find_bundles([p]):
            try:
                bundles[f.relative_to(p).as_posix()] = load_bundle(f)
            except BundleError as e:
                raise SourceError(str(e)) from None
        return BundleSet(text, "dir", bundles)
    if p.is_file():
        try:
            return BundleSet(text, "file", {p.name: load_bundle(p)})
        except BundleError as e:
            raise SourceError(str(e)) from None
    split = _split_rev(text)
    if split is not None:
        return _load_git(text, *split, cwd=cwd, missing_ok=missing_ok)
    if missing_ok:
        return BundleSet(text, "missing", {})
    raise SourceError(f"{text}: no such file or directory (nor a git REV:PATH)")
