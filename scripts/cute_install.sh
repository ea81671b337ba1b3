#!/usr/bin/env bash
# On the GPU machine, after .cute_a and .cute_b have both arrived (scripts/cute_wheels.sh): the CuTe extra into
# ~/site, next to the .whl installs (export PYTHONPATH=~/site:$PYTHONPATH as for those).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/cute_wheels
name=$(basename "$(ls .cute_a/*.part.aa)" .part.aa)
cat .cute_a/"$name".part.aa .cute_b/"$name".part.ab > /tmp/cute_wheels/"$name"
cp .cute_b/*.whl /tmp/cute_wheels/
python3 -m pip install -q --no-index --no-deps --target ~/site /tmp/cute_wheels/*.whl
# pip --target does not run the package's .pth, which puts its dsl_packages on sys.path
python3 - <<'PY'
import pathlib, site, sys
home = pathlib.Path.home() / "site"
pth = home / "nvidia_cutlass_dsl_packages.pth"
(home / "sitecustomize.py").write_text("import site, os\nsite.addsitedir(os.path.expanduser('~/site'))\n")
print("installed; .pth present:", pth.exists())
PY
PYTHONPATH=~/site:${PYTHONPATH:-} python3 -c "import cutlass.cute, tvm_ffi; print('cutlass.cute imports')"
