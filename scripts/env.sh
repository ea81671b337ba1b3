#!/usr/bin/env bash
# Creates .venv from scratch with the pinned requirements and installs this project.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv --clear .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements/ci.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
