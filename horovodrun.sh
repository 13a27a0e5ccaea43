#!/usr/bin/env bash
# Launch train.py on Horovod workers.
#   ./horovodrun.sh [-np N] [-H HOSTS] [--gloo|--mpi] [--gpu] [--max-restarts N [--min-workers M]] [train.py arguments]
# It sets the project up (first run only). With no train.py arguments it trains the demo
# (train.py builds the demo data on first use) and reports verification accuracy on the
# demo's held-out identities. Without -np, -H or --gpu it runs as many local workers as
# measured fastest for the network and image size on this node's cores (the demo: 2; a
# start-up line says which and why); else -np defaults to 2, -H to localhost:N. The
# controller is Gloo. Paths are relative to the directory you run it in.
# --max-restarts N restarts a failed job from its newest checkpoint up to N times.
# --gpu trains in the GPU environment (.venv-gpu: MXNet's CUDA build; README: GPUs).
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)   # also when called through a link
NP=""; HOSTS=""; CONTROLLER=--gloo; TRAIN_ARGS=(); RESTARTS=(); GPU=(); LAYOUT=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -np) NP=${2:?"-np needs a number"}; shift 2 ;;
    -H) HOSTS=${2:?"-H needs hosts, e.g. host1:8,host2:8"}; shift 2 ;;
    --gloo|--mpi) CONTROLLER=$1; shift ;;
    --gpu) GPU=(--gpu); shift ;;
    --max-restarts|--min-workers) RESTARTS+=("$1" "${2:?"$1 needs a number"}"); shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) TRAIN_ARGS+=("$1"); shift ;;
  esac
done
# No -np on one CPU node: the layout measured fastest for the run (sample_fc/run/layout.py), said at start.
if [[ -z $NP && -z $HOSTS && ${#GPU[@]} -eq 0 ]]; then LAYOUT=(--auto-layout); fi
NP=${NP:-2}
[[ $NP =~ ^[1-9][0-9]*$ ]] || { echo "horovodrun.sh: -np must be a positive integer, got '$NP'" >&2; exit 2; }
HOSTS=${HOSTS:-localhost:$NP}

"$ROOT/scripts/bootstrap.sh" "${GPU[@]}"
VENV=${SAMPLE_FC_VENV:-$ROOT/.venv${GPU:+-gpu}}
# The GPU environment's CUDA libraries (PyPI wheels): on LD_LIBRARY_PATH, which horovodrun passes on.
if [[ -f $VENV/cuda-env.sh ]]; then . "$VENV/cuda-env.sh"; fi

# Threads: each worker takes cores // (workers on its node) itself (train.py, sample_fc.ranks.share_cores).
# Under --mpi, OpenMPI's mpirun kills the workers 1 s after it forwards a SIGTERM; a stopping run
# (train.py: a checkpoint of the step reached) needs longer (docs/training.md, "Stopping").
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-60}
exec "$VENV/bin/python" -m sample_fc.launch "${LAYOUT[@]}" "${RESTARTS[@]}" -np "$NP" -H "$HOSTS" "$CONTROLLER" \
  "$VENV/bin/python" "$ROOT/train.py" "${TRAIN_ARGS[@]}"
