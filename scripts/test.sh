#!/usr/bin/env bash
# The README's test command: sets up the environment if needed, then runs the whole test
# suite (including the 2-worker Horovod tests). Extra arguments go to pytest.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/bootstrap.sh"
VENV=${SAMPLE_FC_VENV:-$ROOT/.venv}
cd "$ROOT"
# Test-only packages (torch, CPU build, for the PyTorch reference tests): installed without
# their declared dependencies (see requirements-test.txt), once per version of that file.
TEST_STAMP=$VENV/.sample_fc_test_stamp
TEST_WANT=$(sha256sum requirements-test.txt | cut -c1-16)
if [[ $(cat "$TEST_STAMP" 2>/dev/null) != "$TEST_WANT" ]]; then
  echo "[test] installing test-only packages (requirements-test.txt)" >&2
  "$VENV/bin/python" -m pip --disable-pip-version-check -q install --no-deps -r requirements-test.txt \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  "$VENV/bin/python" -c 'import torch' || { echo "[test] ERROR: torch does not import" >&2; exit 1; }
  echo "$TEST_WANT" > "$TEST_STAMP"
fi
# A native crash in any process of the suite (a worker's rare start-up segfault) prints every
# thread's Python stack and dies of its signal; MXNet's own handler, which prints only
# "Segmentation fault: 11" and exits 255, stands aside when this one is installed first.
export PYTHONFAULTHANDLER=1
set +e
"$VENV/bin/python" -m pytest tests --timeout=900 "$@"
status=$?
set -e
if [[ $status -eq 5 ]]; then
  echo "[test] ERROR: pytest collected no tests" >&2
fi
exit $status
