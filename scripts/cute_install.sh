#!/usr/bin/env bash
# On the GPU machine, in each of the three calls that carry .cute_a, .cute_b, .cute_c (scripts/cute_wheels.sh): the
# part this call carried is kept in ~/cute_parts (a carried path is removed from the work tree by the next call that
# does not name it; the home folder stays while the machine is warm), and once all three are there, the CuTe extra
# goes into ~/site next to the .whl installs.
set -euo pipefail
cd "$(dirname "$0")/.."
parts=~/cute_parts
mkdir -p "$parts"
for d in .cute_a .cute_b .cute_c; do [ -d "$d" ] && cp "$d"/* "$parts"/; done
name=$(basename "$(ls "$parts"/*.part.aa 2>/dev/null || echo none.part.aa)" .part.aa)
for p in aa ab ac; do
  [ -f "$parts/$name.part.$p" ] || { echo "cute_install: part $p not yet carried (have: $(ls "$parts" | tr '\n' ' '))"; exit 0; }
done
mkdir -p /tmp/cute_wheels
cat "$parts/$name".part.aa "$parts/$name".part.ab "$parts/$name".part.ac > /tmp/cute_wheels/"$name"
cp "$parts"/*.whl /tmp/cute_wheels/
python3 -m pip install -q --no-index --no-deps --target ~/site /tmp/cute_wheels/*.whl
# pip --target does not run the package's .pth (it puts dsl_packages on sys.path): name that folder on PYTHONPATH
# instead, in every command that uses the CuTe backend:
#   export PYTHONPATH=~/site:~/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
PYTHONPATH=~/site:~/site/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-} python3 -c "import cutlass.cute, tvm_ffi; print('cutlass.cute imports')"
