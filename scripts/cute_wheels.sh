#!/usr/bin/env bash
# Helion's CuTe extra (helion[cute]) for the GPU image (python 3.12, torch with CUDA 13), which lacks it and cannot
# reach PyPI. Its CUDA 13 libraries are one 84 MiB wheel; a device call carries 64 MiB with the ~14 MiB work tree, so
# the set goes in three calls to the same warm machine, each starting with `bash scripts/cute_install.sh` (it keeps
# the part carried in ~/cute_parts and installs once all three are there):
#   here:        bash scripts/cute_wheels.sh            -> .cute_a, .cute_b, .cute_c (~37 MiB each), git-ignored
#   device 1, 2: carry [".cute_a"], then [".cute_b"]
#   device 3:    carry [".cute_c"], then the CuTe GPU tests
set -euo pipefail
cd "$(dirname "$0")/.."
for d in a b c; do grep -qx "/.cute_$d/" .git/info/exclude 2>/dev/null || echo "/.cute_$d/" >> .git/info/exclude; done
rm -rf .cute_a .cute_b .cute_c /tmp/cute_wheels && mkdir -p .cute_a .cute_b .cute_c /tmp/cute_wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d /tmp/cute_wheels \
  nvidia-cutlass-dsl==4.7.0 nvidia-cutlass-dsl-libs-base==4.7.0 nvidia-cutlass-dsl-libs-core==4.7.0 \
  nvidia-cutlass-dsl-libs-cu13==4.7.0 apache-tvm-ffi==0.1.15.post2 cuda-bindings==13.4.4 cuda-core==1.2.2 \
  cuda-pathfinder==1.9.1 cuda-python==13.4.4 nvidia-cuda-nvdisasm==13.5.37
libs=$(ls /tmp/cute_wheels/nvidia_cutlass_dsl_libs_cu13-*.whl)
split -b 37m "$libs" ".cute_a/$(basename "$libs").part."
mv .cute_a/*.part.ab .cute_b/
mv .cute_a/*.part.ac $(ls /tmp/cute_wheels/*.whl | grep -v libs_cu13) .cute_c/
du -sh .cute_a .cute_b .cute_c
