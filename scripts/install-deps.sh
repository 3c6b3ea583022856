#!/usr/bin/env bash
# Installs what tern needs on Debian 12, idempotently: Debian packages via
# apt-get (only those missing) and Python packages into .venv (Debian 12
# refuses system-wide pip installs). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config clang libclang-rt-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libzstd-dev zstd libxxhash-dev libssl-dev openssl
  nlohmann-json3-dev  # safetensors headers, indexes, config.json (docs/checkpoint.md, "JSON")
  libcli11-dev  # the tern command line (docs/cli.md)
  libcpp-httplib-dev  # the agent's admin HTTP port and etcd's JSON gateway (docs/agent/operations.md, etcd.md)
  etcd-server etcd-client  # the board in etcd: tests start a real etcd (docs/agent/etcd.md)
  ccache  # optional: the build uses it when present (rebuilds, several checkouts)
  libucx-dev ucx-utils libibverbs-dev
  python3 python3-venv python3-numpy python3-torch libopenblas0-pthread
  python3-matplotlib  # the scale simulator's plots (bench/sim/scale.py, docs/scale.md)
  xdelta3 iperf3 iproute2 iputils-ping procps ethtool
  gdb  # the test watchdog prints the stacks of a hung test with it
  curl  # tests/cli/test_agent.py reads /metrics with it; bench/fanout's HTTP baselines fetch with it
  nginx-light  # bench/fanout's HTTP baselines serve with it (started per run in a testbed namespace, never as a service)
  faketime  # tests/soak/soak.py skews one member's clock (libfaketime via LD_PRELOAD; docs/soak.md)
  pybind11-dev python3-dev python3-pytest  # the Python module (python/) and its tests
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python: a venv that sees Debian's torch/numpy (system site packages) plus
# PyPI-only references (ml_dtypes) for the cast tests.
# Debian's interpreter explicitly: a pyenv/conda python3 earlier on PATH
# would not see python3-torch. numpy stays below 2 because Debian's torch
# 1.13 is built against numpy 1.x (ml_dtypes would otherwise pull numpy 2
# into the venv and break torch.from_numpy).
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
if ! .venv/bin/python -c 'import ml_dtypes, torch; torch.zeros(1).numpy()' 2>/dev/null; then
  .venv/bin/pip install -q ml_dtypes 'numpy<2'
fi
# safetensors: the reference reader/writer for the checkpoint interop test
# (it needs no numpy of its own; the venv's numpy<2 above serves it).
if ! .venv/bin/python -c 'import safetensors, numpy' 2>/dev/null; then
  .venv/bin/pip install -q safetensors
fi
# Engine loaders for tests/python/test_engine_loaders.py: compressed-tensors
# (the loader behind "quant_method": "compressed-tensors" in transformers and
# vLLM) and gpt-oss (OpenAI's reference MXFP4 loader). Both go in with
# --no-deps so that pip never resolves torch (newer compressed-tensors want
# torch >= 2.10, gpt-oss[torch] >= 2.7: PyPI's multi-GB CUDA build) and
# Debian's torch 1.13 stays. compressed-tensors 0.12.2 is the newest release
# that imports on torch 1.13 (with torch.compile and the float8 dtype names
# supplied for the import; see the test); its small dependencies are named
# here (transformers only for AutoConfig; it installs without torch).
# gpt-oss declares Python >= 3.12; the loader module used runs on 3.11.
if ! .venv/bin/python -c 'import importlib.metadata as m
assert m.version("compressed-tensors") == "0.12.2" and m.version("gpt-oss") == "0.0.9"
assert m.version("transformers") == "5.24.0"
import pydantic, loguru' 2>/dev/null; then
  .venv/bin/pip install -q 'numpy<2' 'pydantic>=2,<3' loguru transformers==5.24.0
  .venv/bin/pip install -q --no-deps compressed-tensors==0.12.2
  .venv/bin/pip install -q --no-deps --ignore-requires-python gpt-oss==0.0.9
fi
