#!/bin/sh
# Installs libtern from BUILD into a temporary prefix and builds the C
# example (examples/c) against it as an outside project would, both ways:
# CMake's find_package(tern) (the tern::tern target) and pkg-config tern,
# compiled as C99 with -Wall -Werror -pedantic; then runs both binaries.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR C_COMPILER
set -eu
build=$1
src=$2
cc=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tern-install-test-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" --component tern >"$tmp/install.log"
libdir=$(dirname "$(find "$prefix" -name 'libtern.so.*.*.*' | head -1)")
for f in "$prefix/include/tern/tern.h" "$libdir/libtern.so" "$libdir/pkgconfig/tern.pc" \
         "$libdir/cmake/tern/ternConfig.cmake" "$libdir/cmake/tern/ternConfigVersion.cmake"; do
  [ -e "$f" ] || { echo "install_test: $f was not installed" >&2; cat "$tmp/install.log" >&2; exit 1; }
done
# Only the C API's files: nothing of the C++ inside (headers, static libraries).
extra=$(cd "$prefix" && find . -type f | grep -v -e '/tern/tern.h$' -e '/libtern.so.' -e '/tern.pc$' \
          -e '/ternConfig.cmake$' -e '/ternConfigVersion.cmake$' || true)
[ -z "$extra" ] || { echo "install_test: unexpected files installed:" >&2; echo "$extra" >&2; exit 1; }

# 1. find_package(tern) from a separate CMake project.
cmake -S "$src/examples/c" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_COMPILER="$cc" >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log" >&2; exit 1; }
cmake --build "$tmp/cmake-build" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log" >&2; exit 1; }
"$tmp/cmake-build/publish_and_serve" "$tmp/run-cmake" >"$tmp/run-cmake.log" 2>&1 ||
  { cat "$tmp/run-cmake.log" >&2; exit 1; }
grep -q "member serves version 2" "$tmp/run-cmake.log"
echo "install_test: find_package(tern) consumer built and ran"

# A version the package does not serve is refused.
mkdir -p "$tmp/too-new"
cat >"$tmp/too-new/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(too_new LANGUAGES C)
find_package(tern 99 REQUIRED)
CMAKE
if cmake -S "$tmp/too-new" -B "$tmp/too-new/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null 2>&1; then
  echo "install_test: find_package(tern 99) succeeded against tern $(grep -o 'Version: .*' "$libdir/pkgconfig/tern.pc")" >&2
  exit 1
fi

# 2. pkg-config tern, plain compiler line.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
flags=$(pkg-config --cflags --libs tern)
mkdir -p "$tmp/pc"
# shellcheck disable=SC2086 # the flags are words
"$cc" -std=c99 -Wall -Wextra -Werror -pedantic -I"$src/examples/c" "$src/examples/c/publish_and_serve.c" \
      $flags -Wl,-rpath,"$libdir" -o "$tmp/pc/publish_and_serve"
"$tmp/pc/publish_and_serve" "$tmp/run-pc" >"$tmp/run-pc.log" 2>&1 || { cat "$tmp/run-pc.log" >&2; exit 1; }
grep -q "member serves version 2" "$tmp/run-pc.log"
echo "install_test: pkg-config tern consumer ($flags) built and ran"
