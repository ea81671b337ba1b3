#!/usr/bin/env bash
# README command 2: fresh environment, then the test suite (GPU tests skip with a reason on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/env.sh
exec .venv/bin/python -m pytest -p no:logging -q -rs "$@"
