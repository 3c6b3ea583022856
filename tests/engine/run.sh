#!/usr/bin/env bash
# Runs the engine tests (test_vllm.py) with the engine venv that
# scripts/install-engine-env.sh built. A missing venv is a failure, never a
# skip: CI installs it first (scripts/test.sh).
#   run.sh TERN [FORMAT...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${TERN_ENGINE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tern/engine-venv}
if [ ! -f "$venv/.tern-engine-env" ] || [ ! -x "$venv/bin/python" ]; then
  echo "FAIL: no engine environment at $venv; run scripts/install-engine-env.sh" \
       "(scripts/test.sh does)" >&2
  exit 1
fi
# vLLM is CPU-heavy and the machine is shared: lowest priority. Threads: one
# per core is vLLM's default; the model is tiny either way.
exec nice -n 10 "$venv/bin/python" "$here/test_vllm.py" "$@"
