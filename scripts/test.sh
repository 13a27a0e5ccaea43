#!/usr/bin/env bash
# The README's test command: sets up the environment if needed, then runs the whole test
# suite (including the 2-worker Horovod tests). Extra arguments go to pytest.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/bootstrap.sh"
VENV=${SAMPLE_FC_VENV:-$ROOT/.venv}
cd "$ROOT"
set +e
"$VENV/bin/python" -m pytest tests --timeout=900 "$@"
status=$?
set -e
if [[ $status -eq 5 ]]; then
  echo "[test] ERROR: pytest collected no tests" >&2
fi
exit $status
