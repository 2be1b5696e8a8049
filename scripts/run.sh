#!/usr/bin/env bash
# Set up, then run the main job: the DeepSeek decode benchmark on the embedded default
# (CPU: 2 gloo processes + the reference backend; GPUs: the NVSHMEM kernels and the
# reference backend on NCCL side by side). Extra arguments go to `moe-backend bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
backend=auto
if .venv/bin/python -c "import torch; assert torch.cuda.device_count() >= 2" 2>/dev/null; then backend=all; fi
exec .venv/bin/moe-backend bench --config deepseek_decode --backend "$backend" --out out/bench.json "$@"
