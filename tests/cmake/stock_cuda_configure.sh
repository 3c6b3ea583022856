#!/bin/sh
# Configures tern with CUDA against Debian 12's stock FindCUDAToolkit module
# (CMake 3.25.1, package cmake-data), as a user's machine has it, rather than
# whatever copy this machine carries. Configure only.
#
#   stock_cuda_configure.sh SOURCE_DIR WORK_DIR
#
# Debian's stock modules (all of them: FindCUDAToolkit includes its
# neighbours) come from cmake-data fetched with `apt-get download` into
# WORK_DIR and kept for the next run. Exit 77 (skip) without nvcc, or
# without a way to get the package.
set -eu
src=$1
work=$2
mkdir -p "$work"
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc" ]; then
  echo "skip: no nvcc (the failure needs the CUDA toolkit)"
  exit 77
fi

modules=$work/stock-modules
if [ ! -f "$modules/FindCUDAToolkit.cmake" ]; then
  deb=$(ls "$work"/cmake-data_3.25.1-*_all.deb 2>/dev/null | head -n 1 || true)
  if [ -z "$deb" ]; then
    if ! (cd "$work" && apt-get download cmake-data=3.25.1-1 >/dev/null 2>&1); then
      echo "skip: cannot fetch Debian's cmake-data 3.25.1 (apt-get download cmake-data=3.25.1-1)"
      exit 77
    fi
    deb=$(ls "$work"/cmake-data_3.25.1-*_all.deb | head -n 1)
  fi
  rm -rf "$work/x"
  dpkg-deb -x "$deb" "$work/x"
  rm -rf "$modules"
  mv "$work"/x/usr/share/cmake-3.25/Modules "$modules"
  rm -rf "$work/x"
fi

# The module must be the stock one: it has the unguarded set_property.
grep -q 'if(CMAKE_MINIMUM_REQUIRED_VERSION VERSION_GREATER_EQUAL 3.25)' "$modules/FindCUDAToolkit.cmake"

build=$work/build
rm -rf "$build"
if ! cmake -S "$src" -B "$build" -DTERN_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
     -DCMAKE_MODULE_PATH="$modules" -DTERN_ENGINE_TESTS=OFF -DTERN_BUILD_BENCH=OFF \
     >"$work/configure.log" 2>&1; then
  cat "$work/configure.log"
  echo "FAIL: configure with the stock FindCUDAToolkit"
  exit 1
fi
grep -q "tern GPU kernels: ON" "$work/configure.log" || {
  cat "$work/configure.log"
  echo "FAIL: configured, but without the GPU kernels"
  exit 1
}
echo "configure with Debian's stock FindCUDAToolkit and $($nvcc --version | tail -n 1): ok"
