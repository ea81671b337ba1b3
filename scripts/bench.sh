#!/usr/bin/env bash
# README command 1: fresh environment, then `python -m bench` (validates on CPU; times on a GPU with --bench).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/env.sh
exec .venv/bin/python -m bench "$@"
