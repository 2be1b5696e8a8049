#!/usr/bin/env bash
# Create .venv (Python 3.12) and install moe_backend with its test, megatron and nvshmem
# extras. Builds the native extension when nvcc is present (see csrc/build.py).
# Idempotent: a second run only checks what is installed. Sourced by run.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.12}
# A fresh install (torch's CUDA build, triton, the extension) takes ~5.7 GiB of disk;
# install_deps.py keeps pip's peak near that. Warn, not refuse: the estimate is not exact.
NEED_GB=${MOE_BACKEND_SETUP_NEED_GB:-6}
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  free_gb=$(( $(df -Pk . | awk 'NR==2 {print $4}') / 1048576 ))
  if [ "$free_gb" -lt "$NEED_GB" ]; then
    echo "setup_env.sh: warning: $free_gb GB free under $(pwd); the install takes about $NEED_GB GB." \
      "If pip stops with 'No space left on device', free some space and rerun." >&2
  fi
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --retries 10 --upgrade pip
# A dropped connection resumes the download (torch's wheel is ~550 MB) instead of failing.
PIP_NET=(--retries 10 --resume-retries 20)
# Every dependency first, a large wheel at a time (see install_deps.py): the extension's
# build imports torch (we build with --no-build-isolation).
.venv/bin/python scripts/install_deps.py setuptools wheel -e ".[test,megatron,nvshmem]" -- "${PIP_NET[@]}"
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
  # nvcc may be a wrapper script; ask it where its toolkit lives.
  CUDA_HOME=$(nvcc --dryrun -c /dev/null -x cu 2>&1 | sed -n 's/^#\$ TOP=\(.*\)\/bin\/\.\.$/\1/p' | head -n1)
  export CUDA_HOME
fi
if ! .venv/bin/python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}  # no GPU to probe: build for H100/H200
fi
# Reinstall (and rebuild the extension) only when the build inputs changed: Python edits
# need nothing, the install is editable.
stamp=.venv/.moe_backend_build_stamp
inputs=$(cat setup.py csrc/* 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$inputs" ]; then
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
  # Bytecode for what the package and its tests import (~75 MB; all modules' would be ~0.2 GB,
  # see install_deps.py): where PYTHONDONTWRITEBYTECODE is set, each process would otherwise
  # recompile torch and megatron-core (~7 s a start). Only a speed-up: the tests report failures.
  env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -W ignore -c \
    "import torch, moe_backend, megatron.core.transformer.moe.token_dispatcher" 2>/dev/null || true
  echo "$inputs" > "$stamp"
fi
