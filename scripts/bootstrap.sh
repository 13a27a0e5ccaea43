#!/usr/bin/env bash
# Creates or refreshes the project's virtual environment (.venv) with pinned packages and
# horovod 0.28.1 built from source for MXNet + Gloo (+ MPI when `mpicxx` is on PATH), with
# the source fixes of scripts/patch_horovod.py.
# Idempotent: when nothing changed since the last successful run it returns in seconds.
#   SAMPLE_FC_VENV   where the environment lives (default: <repo>/.venv)
#   PYTHON           interpreter to create it with (default: python3)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${SAMPLE_FC_VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
HOROVOD_VERSION=0.28.1
log() { echo "[bootstrap] $*" >&2; }
die() { echo "[bootstrap] ERROR: $*" >&2; exit 1; }

# The horovod build variant depends on what the machine offers; the wheel cache is keyed
# on it because pip's own cache ignores HOROVOD_* flags.
if command -v mpicxx >/dev/null 2>&1; then VARIANT=gloo-mpi; else VARIANT=gloo; fi

# Everything that should trigger a refresh goes into the stamp.
STAMP_WANT=$( { cat "$ROOT/scripts/bootstrap.sh" "$ROOT/scripts/patch_horovod.py" "$ROOT/requirements.txt" "$ROOT/setup.py" "$ROOT/sample_fc/_half_rows.c" "$ROOT/scripts/patch_mxnet.py";
                echo "$VARIANT"; "$PYTHON" -VV; } | sha256sum | cut -c1-16)
STAMP_FILE=$VENV/.sample_fc_stamp
if [[ -f $STAMP_FILE && $(cat "$STAMP_FILE") == "$STAMP_WANT" && -x $VENV/bin/horovodrun ]]; then
  exit 0
fi

"$PYTHON" -c 'import sys; sys.exit(not (3, 8) <= sys.version_info[:2] <= (3, 12))' \
  || die "need Python 3.8 to 3.12, got $("$PYTHON" -V 2>&1): mxnet 1.9.1 needs numpy < 2, which has no wheels for Python 3.13+; set PYTHON=/path/to/python3.12 (or 3.11, 3.10, ...)"
if [[ ! -x $VENV/bin/python ]]; then
  log "creating virtual environment in $VENV"
  "$PYTHON" -m venv "$VENV" || die "python -m venv failed; on Debian/Ubuntu: apt-get install python3-venv"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# Some machines' pip.conf lists local mirrors that may be absent; hide that noise only.
pip_quiet() { "${PIP[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

log "installing pinned packages (requirements.txt)"
pip_quiet install 'setuptools<70' wheel 'cmake<4' packaging
pip_quiet install -r "$ROOT/requirements.txt"
# mxnet 1.9.1 uses numpy aliases removed in numpy 1.24: scripts/patch_mxnet.py fixes its files
MXNET_DIR=$("$VENV/bin/python" -c 'import importlib.util as u; print(u.find_spec("mxnet").submodule_search_locations[0])') \
  || die "mxnet is not installed in $VENV"
"$VENV/bin/python" "$ROOT/scripts/patch_mxnet.py" "$MXNET_DIR" >/dev/null || die "could not patch mxnet in $MXNET_DIR"
"$VENV/bin/python" -c 'import mxnet; mxnet.nd.ones(2).asnumpy(); mxnet.np.ones(2) > 0' \
  || die "mxnet 1.9.1 does not run with the installed numpy"

# The build is keyed on version, variant, Python (a wheel is built for one) and our source
# fixes (scripts/patch_horovod.py).
PYTAG=$("$VENV/bin/python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
BUILD_ID=$HOROVOD_VERSION-$VARIANT-$PYTAG-fix$(sha256sum "$ROOT/scripts/patch_horovod.py" | cut -c1-8)
WHEEL_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/sample_fc/wheels/horovod-$BUILD_ID
installed_build=$(cat "$VENV/.horovod_build" 2>/dev/null || true)
if [[ $installed_build != "$BUILD_ID" ]] || ! "$VENV/bin/python" -c 'import horovod.mxnet' 2>/dev/null; then
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    log "building horovod $HOROVOD_VERSION ($VARIANT, patched) from source, about 3 minutes on 2 cores"
    mkdir -p "$WHEEL_DIR"
    build_log=$WHEEL_DIR/build.log
    source_dir=$(mktemp -d)
    trap 'rm -rf "$source_dir"' EXIT
    "${PIP[@]}" download --no-deps --no-binary :all: --no-build-isolation -d "$source_dir" \
        "horovod==$HOROVOD_VERSION" >"$build_log" 2>&1 \
      || { tail -n 20 "$build_log" >&2; die "could not download the horovod $HOROVOD_VERSION source from PyPI"; }
    tar -xzf "$source_dir"/horovod-"$HOROVOD_VERSION".tar.gz -C "$source_dir"
    "$VENV/bin/python" "$ROOT/scripts/patch_horovod.py" "$source_dir/horovod-$HOROVOD_VERSION" >>"$build_log" \
      || die "could not patch the horovod source; see $build_log"
    export HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 \
           HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1
    if [[ $VARIANT == gloo-mpi ]]; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
    export MAKEFLAGS="-j$(nproc)"
    PATH="$VENV/bin:$PATH" "${PIP[@]}" wheel --no-deps --no-build-isolation --no-cache-dir \
        -w "$WHEEL_DIR" "$source_dir/horovod-$HOROVOD_VERSION" >>"$build_log" 2>&1 \
      || { tail -n 40 "$build_log" >&2; rm -f "$WHEEL_DIR"/*.whl;
           die "horovod build failed; full log: $build_log (see README, Troubleshooting)"; }
  else
    log "reusing cached horovod wheel from $WHEEL_DIR"
  fi
  pip_quiet install --force-reinstall --no-deps "$WHEEL_DIR"/horovod-*.whl
  pip_quiet install cloudpickle psutil pyyaml   # horovod's runtime requirements
  echo "$BUILD_ID" > "$VENV/.horovod_build"
fi

check=$("$VENV/bin/horovodrun" --check-build 2>&1) || die "horovodrun --check-build failed: $check"
grep -q '\[X\] MXNet' <<<"$check" \
  || die "horovod was built without MXNet support:\n$check\nDelete $WHEEL_DIR and re-run."
grep -q '\[X\] Gloo' <<<"$check" || die "horovod was built without Gloo:\n$check"
if [[ $VARIANT == gloo-mpi ]]; then
  grep -q '\[X\] MPI' <<<"$check" || die "mpicxx is present but horovod lacks MPI:\n$check\nDelete $WHEEL_DIR and re-run."
fi

pip_quiet install --no-deps --no-build-isolation -e "$ROOT"
echo "$STAMP_WANT" > "$STAMP_FILE"
log "ready: $VENV (horovod $HOROVOD_VERSION, $VARIANT)"
