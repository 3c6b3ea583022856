#!/usr/bin/env bash
# The GPU path's check (docs/gpu.md), in one run (< 5 min on one H100/H200):
#   1. builds the GPU path (only its targets, for this GPU's architecture),
#   2. runs the kernel-logic tests (CPU) and the device equivalence tests
#      against the CPU reference (they fail, not skip, when no GPU is seen),
#      including a tensor of more than 2^31 elements, format-2 (CONTEXT)
#      apply, the pinned staging upload and tensor-parallel shard apply
#      (islands of 1, 2 and 4 ranks simulated on the one GPU),
#   3. benchmarks apply (format 1 and 2), encode, digest and quantize
#      against a device-to-device copy of the same view, in the same run.
# The log goes to stdout and to $OUT/gpu_check.log (OUT: the device tool's
# output folder; default the build folder). docs/gpu.md explains the figures.
#
# Usage: bench/gpu_check.sh [--quick]     (--quick: a smaller benchmark)
# Environment: BUILD (default build/gpu), JOBS (default nproc),
#   CUDA_ARCH (default: this GPU's compute capability, e.g. 90).
# Exit: 0 all passed; 1 a build, test or check failed; 3 no GPU here (the
#   build and the CPU tests ran, the device part did not).
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/gpu}
JOBS=${JOBS:-$(nproc)}
QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1
mkdir -p "$BUILD"
LOG_DIR=${OUT:-$BUILD}
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/gpu_check.log"
exec > >(tee "$LOG") 2>&1
start=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - start )) s)"; }

step "machine"
date -u
git rev-parse --short HEAD 2>/dev/null || echo "(not a git checkout)"
echo "$(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GB", $2 / 1e6}' /proc/meminfo) memory"
export PATH="$PATH:/usr/local/cuda/bin"
have_gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  have_gpu=1
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv
else
  echo "no GPU visible (nvidia-smi absent or failing): only the build and the CPU tests will run"
fi
missing=()
for tool in cmake nvcc g++ pkg-config python3; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  echo "missing tools: ${missing[*]} (the build needs CMake >= 3.25, the CUDA toolkit, GCC and the"
  echo "Debian packages in README.md: libgtest-dev libxxhash-dev libzstd-dev libssl-dev nlohmann-json3-dev libcli11-dev)"
  exit 1
fi
nvcc --version | tail -1
cmake --version | head -1

if [[ -z "${CUDA_ARCH:-}" ]]; then
  if ((have_gpu)); then
    CUDA_ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
  else
    CUDA_ARCH="90;100"
  fi
fi

step "configure (CUDA architectures $CUDA_ARCH)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTERN_BUILD_BENCH=ON \
  "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH" >"$BUILD/configure.log" 2>&1 || {
  tail -40 "$BUILD/configure.log"; exit 1; }
grep "tern GPU kernels" "$BUILD/configure.log"
grep -q "tern GPU kernels: ON" "$BUILD/configure.log" || { echo "nvcc was not usable by CMake"; exit 1; }

step "build"
cmake --build "$BUILD" -j "$JOBS" --target gpu_ops_test gpu_test gpu_bench >"$BUILD/build.log" 2>&1 || {
  grep -E "error|Error" "$BUILD/build.log" | head -40; exit 1; }
echo "built gpu_ops_test gpu_test gpu_bench"

step "kernel logic against the CPU reference (runs on the CPU)"
"$BUILD/gpu/gpu_ops_test" --gtest_brief=1

if ((!have_gpu)); then
  step "device tests (expected to skip: no GPU)"
  "$BUILD/gpu/gpu_test" --gtest_brief=1
  echo
  echo "RESULT: no GPU here; built and CPU-tested only, the device part was NOT run"
  exit 3
fi

step "device equivalence tests (GPU against the CPU reference, bit for bit)"
TERN_REQUIRE_GPU=1 TERN_GPU_LARGE=1 "$BUILD/gpu/gpu_test" --gtest_brief=1

step "benchmarks (each figure checked against the CPU result before it is printed)"
if ((QUICK)); then
  timeout 120 "$BUILD/bench/gpu_bench" --elements $((1 << 26)) --tensors 8 --densities 0.01,0.001 --reps 3 \
    --quant-elements $((1 << 24))
else
  timeout 200 "$BUILD/bench/gpu_bench" --elements $((1 << 30)) --tensors 32 --densities 0.01,0.001,0.1 --reps 5 \
    --quant-elements $((1 << 28))
fi

step "done"
echo "RESULT: all GPU checks passed (log: $LOG)"
