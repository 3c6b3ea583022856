#!/usr/bin/env bash
# Runs the engine tests with the engine venv that
# scripts/install-engine-env.sh built. A missing venv is a failure, never a
# skip: CI installs it first (scripts/test.sh).
#   run.sh TERN [FORMAT...]       test_vllm.py: tern cast's views in vLLM
#   run.sh --backend [--updates N] test_tern_vllm.py: the tern weight-transfer
#                                 backend (engines/vllm) in vLLM's server
#   run.sh --e2e TERN TERN_AGENT TERN_SIDECAR
#                                 test_agent_e2e.py: two vLLM servers behind
#                                 tern-agent members and tern-sidecars
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${TERN_ENGINE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tern/engine-venv}
if [ ! -f "$venv/.tern-engine-env" ] || [ ! -x "$venv/bin/python" ]; then
  echo "FAIL: no engine environment at $venv; run scripts/install-engine-env.sh" \
       "(scripts/test.sh does)" >&2
  exit 1
fi
if [ "${1:-}" = "--backend" ]; then
  shift
  # tern-vllm from this tree (reinstalled only when it changed: a second).
  "$here/../../scripts/install-engine-env.sh" >/dev/null
  exec nice -n 10 "$venv/bin/python" "$here/test_tern_vllm.py" "$@"
fi
if [ "${1:-}" = "--e2e" ]; then
  shift
  "$here/../../scripts/install-engine-env.sh" >/dev/null
  exec nice -n 10 "$venv/bin/python" "$here/test_agent_e2e.py" "$@"
fi
# vLLM is CPU-heavy and the machine is shared: lowest priority. Threads: one
# per core is vLLM's default; the model is tiny either way.
exec nice -n 10 "$venv/bin/python" "$here/test_vllm.py" "$@"
