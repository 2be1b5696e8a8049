#!/usr/bin/env bash
# Set up, then run the test suite (a GPU test runs only where the GPUs it asks for are present).
# pytest's own exit codes pass through: 5 (no tests collected) fails like any other.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m pytest -q "$@"
