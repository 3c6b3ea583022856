#!/usr/bin/env bash
# Installs tern's Python module, as built in BUILD (default build/release;
# python/CMakeLists.txt assembles it in BUILD/python/tern), into .venv: a
# .pth file in the venv's site-packages names that directory, so
# `.venv/bin/python -c 'import tern'` uses the build and a rebuild needs no
# reinstall. scripts/test.sh runs it after the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
pkg="$PWD/$build/python"
if ! ls "$pkg"/tern/_tern*.so >/dev/null 2>&1; then
  echo "install-python: $pkg/tern has no native module: build the tern_python target first" >&2
  exit 1
fi
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$pkg" >"$site/tern-build.pth"
.venv/bin/python -c 'import tern; print("install-python: tern", tern.version(), "from", tern.__file__)'
