#!/usr/bin/env bash
# Builds moe_backend._C on this (CPU) machine against the GPU machine's torch, so a device call
# carries the build instead of compiling there (~2 min of device time a call):
#   scripts/build_device_extension.sh NAME [VAR=VALUE...]     e.g.  stamps MOE_BACKEND_STAMPS=1
# writes .devso/NAME.so (ignored; name .devso in the device tool's `carry`), and on the GPU
# machine `MOE_BACKEND_DEVSO=NAME source scripts/gpu_env.sh` puts it in place (it builds there
# if the carried file does not load). The build uses a copy of the tracked files (the working
# tree's versions) and a venv with the device's torch (DEVICE_TORCH, default 2.11.0, the GPU
# machine's) and the pinned NVSHMEM wheel, made once at DEVICE_VENV.
set -euo pipefail
usage="usage: scripts/build_device_extension.sh NAME [VAR=VALUE...]"
if [ $# -lt 1 ] || [[ ! $1 =~ ^[A-Za-z0-9_.-]+$ ]]; then
  echo "$usage (NAME: letters, digits, '_', '.', '-')" >&2
  exit 2
fi
name=$1
shift
for kv in "$@"; do
  if [[ ! $kv =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
    echo "$usage: '$kv' is not VAR=VALUE" >&2
    exit 2
  fi
done
cd "$(dirname "$0")/.."
repo=$PWD
venv=${DEVICE_VENV:-$repo/../.device-venv}
torch_version=${DEVICE_TORCH:-2.11.0}
if [ ! -x "$venv/bin/python" ]; then
  python3.12 -m venv "$venv"
  "$venv/bin/pip" install -q "torch==$torch_version" "nvidia-nvshmem-cu13==3.4.5" setuptools numpy ninja
fi
work=$(mktemp -d /tmp/moe_devso.XXXXXX)
trap 'rm -rf "$work"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$work"
mkdir -p "$repo/.devso"
(cd "$work" && env "$@" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda-13.0}" TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS="${MAX_JOBS:-2}" \
  "$venv/bin/python" setup.py build_ext --inplace > "$repo/.devso/$name.log" 2>&1)
cp "$work"/moe_backend/_C*.so "$repo/.devso/$name.so"
echo "wrote .devso/$name.so (torch $torch_version; log .devso/$name.log)"
