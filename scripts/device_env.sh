# Source on the H200 machine (no network there): installs the wheels that
# ../shared/device/prepare.sh put in .device/wheels and puts the project and the
# mamba-ssm baseline source on PYTHONPATH (the link mamba_tune -> kernels names the package).
# Usage: source scripts/device_env.sh
# The copy there has no .git: set MAMBA_TUNE_GIT_SHA=<commit> in the command so bundles
# record which commit tuned them.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/wheels/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.device/baseline
# The image lacks some of the project's dependencies (pyproject.toml's; pydantic and its own):
# say which, in one line, before a command fails on the import.
_missing=$(python3 - <<'PY'
import importlib.metadata as md, re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
names = [re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in deps]
missing = []
for name in names:
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        missing.append(name)
print(" ".join(missing))
PY
)
if [ -n "$_missing" ]; then
    echo "device_env.sh: pyproject.toml dependencies not installed here: $_missing; on a machine with PyPI run: python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d .device/wheels <package> (pydantic brings its own dependencies), then carry .device again" >&2
    unset _missing; return 1
fi
unset _missing
export PYTHONUNBUFFERED=1
alias mamba-tune="python3 -m autotune_cli"
mamba-tune() { python3 -m autotune_cli "$@"; }
