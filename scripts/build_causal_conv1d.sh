#!/usr/bin/env bash
# Build the causal-conv1d CUDA extension (the layer baseline's conv1d) on a machine WITHOUT a
# GPU, for the H200 image (CPython 3.12, torch 2.11.0+cu130), so no device time goes to it.
# Needs nvcc of the image's CUDA (13.0) and PyPI. Takes ~4 minutes on 2 cores, ~5 GB of disk
# in WORK. The result is a `pip install --target` folder: carry it to the device and put it
# on PYTHONPATH after torch is importable (mamba-ssm then runs its fused layer for real).
#
#   bash scripts/build_causal_conv1d.sh [OUT]      (default OUT: .device/cc)
#
# Environment: PYTHON (python3.12), TORCH (2.11.0; PyPI's build of 2.11.0 is the CUDA 13.0
# one), CUDA_HOME (/usr/local/cuda-13.0), ARCH (90: sm_90 only; the package otherwise
# compiles nine architectures and ignores TORCH_CUDA_ARCH_LIST), VERSION (1.7.0), WORK
# (/tmp/build-causal-conv1d).
set -euo pipefail
out=$(realpath -m "${1:-.device/cc}")
PYTHON=${PYTHON:-python3.12} TORCH=${TORCH:-2.11.0} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda-13.0}
ARCH=${ARCH:-90} VERSION=${VERSION:-1.7.0} WORK=${WORK:-/tmp/build-causal-conv1d}
if ! "$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    echo "build_causal_conv1d.sh: PYTHON=$PYTHON is not a working CPython 3.12 (the H200 image's); set PYTHON to one, e.g. PYTHON=\$(pyenv root)/versions/3.12.1/bin/python3.12" >&2
    exit 2
fi
mkdir -p "$WORK/tmp" "$WORK/wheels"
[ -x "$WORK/venv/bin/python" ] || "$PYTHON" -m venv "$WORK/venv"
py="$WORK/venv/bin/python"
"$py" -m pip install -q -U pip setuptools wheel ninja packaging numpy "torch==$TORCH"
"$py" -c "import torch; v = torch.version.cuda; assert v and v.startswith('13.'), f'torch {torch.__version__} is built for CUDA {v}, not 13.x'"
rm -rf "$WORK/sdist"
CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE "$py" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
    -d "$WORK/sdist" "causal-conv1d==$VERSION"
tar -xzf "$WORK/sdist/causal_conv1d-$VERSION.tar.gz" -C "$WORK/sdist"
src="$WORK/sdist/causal_conv1d-$VERSION"
# Keep one gencode: replace the run of `cc_flag.append("arch=compute_..")` lines (and the
# `-gencode`/version checks between them) by the one architecture asked for.
"$py" - "$src/setup.py" "$ARCH" <<'PY'
import re, sys
path, arch = sys.argv[1], sys.argv[2]
lines = open(path).read().split("\n")
at = [i for i, l in enumerate(lines) if re.search(r'cc_flag\.append\("arch=compute_\d+,code=sm_\d+"\)', l)]
if not at:
    sys.exit(f"{path}: no gencode lines found; the package's setup.py changed")
indent = lines[at[0]][: len(lines[at[0]]) - len(lines[at[0]].lstrip())]
lines[at[0]: at[-1] + 1] = [f'{indent}cc_flag.append("arch=compute_{arch},code=sm_{arch}")']
open(path, "w").write("\n".join(lines))
PY
grep -n 'arch=compute' "$src/setup.py"
# The toolkit lacks some library headers that torch's includes name: the pip CUDA wheels have them.
inc=$("$py" -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'include'))")
PATH="$WORK/venv/bin:$CUDA_HOME/bin:$PATH" CUDA_HOME=$CUDA_HOME CPATH=$inc TMPDIR=$WORK/tmp \
    CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=${MAX_JOBS:-$(nproc)} \
    nice -n 10 "$py" -m pip wheel -q --no-index --no-deps --no-build-isolation -w "$WORK/wheels" "$src"
rm -rf "$out"
"$py" -m pip install -q --no-index --no-deps --target "$out" "$WORK/wheels/causal_conv1d-$VERSION"-*.whl
PYTHONPATH=$out "$py" -c "import torch, causal_conv1d_cuda, causal_conv1d; print('built', causal_conv1d.__version__, causal_conv1d_cuda.__file__)"
