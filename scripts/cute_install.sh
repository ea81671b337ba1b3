#!/usr/bin/env bash
# On the GPU machine, after .cute_a, .cute_b and .cute_c have all arrived (scripts/cute_wheels.sh): the CuTe extra into
# ~/site, next to the .whl installs.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/cute_wheels
name=$(basename "$(ls .cute_a/*.part.aa)" .part.aa)
cat .cute_a/"$name".part.aa .cute_b/"$name".part.ab .cute_c/"$name".part.ac > /tmp/cute_wheels/"$name"
cp .cute_c/*.whl /tmp/cute_wheels/
python3 -m pip install -q --no-index --no-deps --target ~/site /tmp/cute_wheels/*.whl
# pip --target does not run the package's .pth (it puts dsl_packages on sys.path): name that folder on PYTHONPATH
# instead, in every command that uses the CuTe backend:
#   export PYTHONPATH=~/site:~/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
PYTHONPATH=~/site:~/site/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-} python3 -c "import cutlass.cute, tvm_ffi; print('cutlass.cute imports')"
