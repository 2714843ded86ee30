# Source on the H200 machine (no network there): installs the wheels that
# ../shared/device/prepare.sh put in .device/wheels and puts the project and the
# mamba-ssm baseline source on PYTHONPATH (the link mamba_tune -> kernels names the package).
# Usage: source scripts/device_env.sh
# The copy there has no .git: set MAMBA_TUNE_GIT_SHA=<commit> in the command so bundles
# record which commit tuned them.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/wheels/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.device/baseline
export PYTHONUNBUFFERED=1
alias mamba-tune="python3 -m autotune_cli"
mamba-tune() { python3 -m autotune_cli "$@"; }
