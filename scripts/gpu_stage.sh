#!/usr/bin/env bash
# Stages a CUDA build for scripts/gpu_check.sh on another machine, so that a GPU machine with little time
# and no package mirror runs the checks without configuring or compiling anything:
#
#   scripts/gpu_stage.sh [BUILD_DIR] [DEST]    # defaults: build/ci and build/gpu-stage
#
# DEST receives <build>/...: the binaries and shared objects gpu_check.sh runs, stripped, at their paths
# in BUILD_DIR, and lib/: every shared library they need that is neither glibc's, the C++ runtime's nor
# CUDA's or NCCL's (the GPU machine's own CUDA, CUPTI, NCCL and driver are the ones to test against; a
# CUDA runtime found first on LD_LIBRARY_PATH would also replace the one PyTorch brings).
# On the GPU machine, with the checkout at the same absolute path as here (a symbolic link will do):
#
#   cp -a DEST/build/. BUILD_DIR/ && LD_LIBRARY_PATH=DEST/lib:<NCCL's and CUPTI's lib dirs> \
#     GRADSCOPE_GPU_PREBUILT=1 GRADSCOPE_GPU_BUILD_DIR=BUILD_DIR scripts/gpu_check.sh
#
# The binaries carry BUILD_DIR's absolute path (the tests find the CLI and the agent there), which is why
# they must sit at the same path. Exit status: 0 when staged, 2 when BUILD_DIR lacks one of them.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=$(cd "${1:-$repo_root/build/ci}" && pwd)
dest=${2:-$repo_root/build/gpu-stage}

binaries=(
  tests/gradscope_unit_tests
  tests/strategies/gradscope_strategy_tests_nccl
  tests/agent/nccl/nccl-job-real
  tests/agent/nccl/nccl-pair
  bench/gradscope_cuda_bench
  bench/gradscope_nccl_tests_allreduce
  bench/gradscope_gpu_timing_costs
  cli/gradscope
  cli/gradscope-bench
  agent/libgradscope-agent.so
  agent/libgradscope-agent-mpi.so
  agent/libgradscope-agent-nccl.so
  plugins/nccl-profiler/libnccl-profiler-gradscope.so
  plugins/nccl-tuner/libnccl-tuner-gradscope.so
)

rm -rf "$dest"
mkdir -p "$dest/lib"
for binary in "${binaries[@]}"; do
  if [ ! -f "$build_dir/$binary" ]; then
    echo "gpu_stage: $build_dir/$binary is missing: build it first (cmake --build --preset ci)" >&2
    exit 2
  fi
  mkdir -p "$dest/build/$(dirname "$binary")"
  strip --strip-debug -o "$dest/build/$binary" "$build_dir/$binary"
done

# The libraries the GPU machine may lack. glibc, the C++ runtime, the CUDA driver and NCCL stay behind.
skip='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libutil|libpthread|libstdc\+\+|libgcc_s|libcuda|libcudart|libcupti|libnccl)\.'
for binary in "${binaries[@]}"; do
  ldd "$build_dir/$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] || cp -L "$path" "$dest/lib/$name"
done
echo "gpu_stage: $(du -sh "$dest" | cut -f1) in $dest ($(ls "$dest/lib" | wc -l) libraries)"
