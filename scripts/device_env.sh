# Source on the H200 machine (no network there): installs the wheels that
# ../shared/device/prepare.sh put in .device/wheels and puts the project and the
# mamba-ssm baseline source on PYTHONPATH (the folder kernels/ as mamba_tune). Usage: source scripts/device_env.sh
# The copy there has no .git: set MAMBA_TUNE_GIT_SHA=<commit> in the command so bundles
# record which commit tuned them.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/wheels/*.whl || return 1
# The folder kernels/ imports as mamba_tune (pyproject's package-dir): a link gives it that name.
mkdir -p /tmp/mamba-tune-path && ln -sfn "$PWD/kernels" /tmp/mamba-tune-path/mamba_tune
export PYTHONPATH=/tmp/site:/tmp/mamba-tune-path:$PWD:$PWD/.device/baseline
export PYTHONUNBUFFERED=1
alias mamba-tune="python3 -m autotune_cli"
mamba-tune() { python3 -m autotune_cli "$@"; }
