#!/usr/bin/env bash
# Creates or refreshes the project's virtual environment (.venv) with pinned packages and
# horovod 0.28.1 built from source for MXNet + Gloo (+ MPI when `mpicxx` is on PATH), with
# the source fixes of scripts/patch_horovod.py.
# Idempotent: when nothing changed since the last successful run it returns in seconds.
#   --gpu            the GPU environment instead, in <repo>/.venv-gpu (README: GPUs): mxnet-cu117 and
#                    the CUDA 11.7 libraries as NVIDIA's PyPI wheels (requirements-gpu.txt), horovod
#                    built with CUDA and NCCL by a CUDA 11.x nvcc (HOROVOD_CUDA_HOME, CUDA_HOME,
#                    /usr/local/cuda-11.x or Debian's nvidia-cuda-toolkit); $VENV/cuda-env.sh sets
#                    LD_LIBRARY_PATH to the wheels' libraries (horovodrun.sh --gpu and bin/activate
#                    source it)
#   SAMPLE_FC_VENV   where the environment lives (default: <repo>/.venv, with --gpu <repo>/.venv-gpu)
#   PYTHON           interpreter to create it with (default: python3)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { echo "[bootstrap] $*" >&2; }
die() { echo "[bootstrap] ERROR: $*" >&2; exit 1; }
GPU=0
case ${1:-} in
  --gpu) GPU=1 ;;
  "") ;;
  *) die "unknown option '$1': scripts/bootstrap.sh [--gpu]" ;;
esac
if [[ $GPU == 1 ]]; then
  KIND=gpu; REQUIREMENTS=$ROOT/requirements-gpu.txt; VENV=${SAMPLE_FC_VENV:-$ROOT/.venv-gpu}
else
  KIND=cpu; REQUIREMENTS=$ROOT/requirements.txt; VENV=${SAMPLE_FC_VENV:-$ROOT/.venv}
fi
PYTHON=${PYTHON:-python3}
HOROVOD_VERSION=0.28.1

# The horovod build variant depends on what the machine offers; the wheel cache is keyed
# on it because pip's own cache ignores HOROVOD_* flags.
if command -v mpicxx >/dev/null 2>&1; then VARIANT=gloo-mpi; else VARIANT=gloo; fi
if [[ $GPU == 1 ]]; then VARIANT=$VARIANT-cuda11-nccl; fi

# Everything that should trigger a refresh goes into the stamp.
STAMPED=("$ROOT/scripts/bootstrap.sh" "$ROOT/scripts/patch_horovod.py" "$REQUIREMENTS" "$ROOT/setup.py"
         "$ROOT/sample_fc/pfc/_half_rows.c" "$ROOT/sample_fc/_mx_ops.cc" "$ROOT/scripts/patch_mxnet.py"
         "$ROOT/scripts/mxnet_compiled_ops.py")
STAMP_WANT=$( { cat "${STAMPED[@]}"; echo "$VARIANT"; "$PYTHON" -VV; } | sha256sum | cut -c1-16)
STAMP_FILE=$VENV/.sample_fc_stamp
if [[ -f $STAMP_FILE && $(cat "$STAMP_FILE") == "$STAMP_WANT" && -x $VENV/bin/horovodrun ]]; then
  exit 0
fi
# One environment holds one kind: a CPU one is never turned into a GPU one, or back (mxnet and
# mxnet-cu117 install the same files). The kind is its .sample_fc_kind, else the mxnet it has.
if [[ -x $VENV/bin/python ]]; then
  have=$(cat "$VENV/.sample_fc_kind" 2>/dev/null || "$VENV/bin/python" -c '
import importlib.metadata as metadata
for name, kind in (("mxnet-cu117", "gpu"), ("mxnet-cu112", "gpu"), ("mxnet", "cpu")):
    try:
        metadata.version(name)
        print(kind)
        break
    except metadata.PackageNotFoundError:
        pass' 2>/dev/null || true)
  if [[ -n $have && $have != "$KIND" ]]; then
    die "$VENV holds the $have environment, not the $KIND one; set SAMPLE_FC_VENV to another folder"
  fi
fi

"$PYTHON" -c 'import sys; sys.exit(not (3, 8) <= sys.version_info[:2] <= (3, 12))' \
  || die "need Python 3.8 to 3.12, got $("$PYTHON" -V 2>&1): mxnet 1.9.1 needs numpy < 2, which has no wheels" \
         "for Python 3.13+; set PYTHON=/path/to/python3.12 (or 3.11, 3.10, ...)"
if [[ ! -x $VENV/bin/python ]]; then
  log "creating virtual environment in $VENV"
  "$PYTHON" -m venv "$VENV" || die "python -m venv failed; on Debian/Ubuntu: apt-get install python3-venv"
fi
echo "$KIND" > "$VENV/.sample_fc_kind"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# Some machines' pip.conf lists local mirrors that may be absent; hide that noise only.
pip_quiet() { "${PIP[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

log "installing pinned packages ($(basename "$REQUIREMENTS"))"
if [[ $GPU == 1 ]] \
    && ! "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("mxnet-cu117")' 2>/dev/null; then
  log "the GPU environment downloads about 2.0 GB from PyPI unless pip's cache holds it (mxnet-cu117 509 MB,"
  log "cuDNN 557 MB, cuBLAS 317 MB, NCCL 177 MB, cuSPARSE 173 MB, cuFFT 103 MB, cuSOLVER 103 MB, the rest 94 MB)"
  log "and takes about 3.9 GB in $VENV; horovod's CUDA build then takes about 4 minutes on 2 cores"
fi
pip_quiet install 'setuptools<70' wheel 'cmake<4' packaging
pip_quiet install -r "$REQUIREMENTS"
if [[ $GPU == 1 ]]; then
  # mxnet-cu117 loads the CUDA 11.7 libraries by soname: the wheels' lib folders go on LD_LIBRARY_PATH
  # (cuda-env.sh, sourced by horovodrun.sh --gpu and by bin/activate), and libcuda.so.1 comes from the
  # node's NVIDIA driver. Without a driver (a build machine), the CUDA toolkit's stub libcuda stands in
  # for this script's checks and horovod's build only: its calls all fail (CUDA_ERROR_STUB_LIBRARY).
  SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  CUDA_LIBS=$(ls -d "$SITE"/nvidia/*/lib 2>/dev/null | paste -sd: -)
  [[ -n $CUDA_LIBS ]] || die "no nvidia-*-cu11 libraries in $SITE/nvidia"
  { echo "# written by scripts/bootstrap.sh --gpu: the CUDA 11.7 libraries that mxnet-cu117 and horovod load"
    echo "export LD_LIBRARY_PATH=\"$CUDA_LIBS\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""; } > "$VENV/cuda-env.sh"
  grep -q cuda-env.sh "$VENV/bin/activate" || echo ". \"$VENV/cuda-env.sh\"" >> "$VENV/bin/activate"
  # shellcheck source=/dev/null
  . "$VENV/cuda-env.sh"
  if ! "$VENV/bin/python" -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>/dev/null; then
    stub=""
    for candidate in ${HOROVOD_CUDA_HOME:+$HOROVOD_CUDA_HOME/lib64/stubs/libcuda.so} \
        ${CUDA_HOME:+$CUDA_HOME/lib64/stubs/libcuda.so} \
        /usr/local/cuda-11.8/lib64/stubs/libcuda.so /usr/local/cuda-11.7/lib64/stubs/libcuda.so \
        /usr/local/cuda/lib64/stubs/libcuda.so /usr/lib/x86_64-linux-gnu/stubs/libcuda.so; do
      if [[ -f $candidate ]]; then stub=$candidate; break; fi
    done
    [[ -n $stub ]] || die "libcuda.so.1 (the NVIDIA driver's) is not on this machine and no CUDA toolkit's stub" \
      "libcuda.so was found: libmxnet.so (mxnet-cu117) cannot load without one; run this on the GPU node, or" \
      "install a CUDA 11.x toolkit (README: GPUs)"
    STUB_DIR=$(mktemp -d)
    trap 'rm -rf "$STUB_DIR"' EXIT
    ln -s "$stub" "$STUB_DIR/libcuda.so.1"
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$STUB_DIR
    log "no NVIDIA driver here: $stub stands in for libcuda.so.1 while this script runs"
  fi
fi
# mxnet 1.9.1 uses numpy aliases removed in numpy 1.24: scripts/patch_mxnet.py fixes its files
MXNET_DIR=$("$VENV/bin/python" -c \
    'import importlib.util as u; print(u.find_spec("mxnet").submodule_search_locations[0])') \
  || die "mxnet is not installed in $VENV"
"$VENV/bin/python" "$ROOT/scripts/patch_mxnet.py" "$MXNET_DIR" >/dev/null || die "could not patch mxnet in $MXNET_DIR"
"$VENV/bin/python" -c 'import mxnet; mxnet.nd.ones(2).asnumpy(); mxnet.np.ones(2) > 0' \
  || die "mxnet 1.9.1 does not run with the installed numpy"
if [[ $GPU == 1 ]]; then
  "$VENV/bin/python" -c 'import sys, mxnet; sys.exit(not mxnet.runtime.Features().is_enabled("CUDA"))' \
    || die "the mxnet in $VENV is not a CUDA build"
fi

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
    trap 'rm -rf "$source_dir" ${STUB_DIR:+"$STUB_DIR"}' EXIT
    "${PIP[@]}" download --no-deps --no-binary :all: --no-build-isolation -d "$source_dir" \
        "horovod==$HOROVOD_VERSION" >"$build_log" 2>&1 \
      || { tail -n 20 "$build_log" >&2; die "could not download the horovod $HOROVOD_VERSION source from PyPI"; }
    tar -xzf "$source_dir"/horovod-"$HOROVOD_VERSION".tar.gz -C "$source_dir"
    "$VENV/bin/python" "$ROOT/scripts/patch_horovod.py" "$source_dir/horovod-$HOROVOD_VERSION" >>"$build_log" \
      || die "could not patch the horovod source; see $build_log"
    export HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 \
           HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1
    if [[ $VARIANT == gloo-mpi* ]]; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
    if [[ $GPU == 1 ]]; then
      # Horovod's CUDA kernels need the nvcc of a CUDA 11.x toolkit: the nvidia-cuda-nvcc-cu11 wheels hold
      # only ptxas and libnvvm (no nvcc, cicc, fatbinary or nvlink), and CUDA 12/13 build no cubins for
      # 5.0-7.0 and link their own runtime. Cubins for MXNet's architectures; NCCL is the wheel's (the
      # one mxnet-cu117 loads), found through a libnccl.so link.
      cuda_home=""
      for candidate in ${HOROVOD_CUDA_HOME:-} ${CUDA_HOME:-} /usr/local/cuda-11.8 /usr/local/cuda-11.7 \
          /usr/local/cuda /usr/lib/nvidia-cuda-toolkit; do
        if [[ -x $candidate/bin/nvcc ]] \
            && "$candidate/bin/nvcc" --version 2>/dev/null | grep -q 'release 11\.[1-8]'; then
          cuda_home=$candidate; break
        fi
      done
      [[ -n $cuda_home ]] || die "horovod's CUDA build needs the nvcc of a CUDA 11.1-11.8 toolkit and none was" \
        "found (HOROVOD_CUDA_HOME, CUDA_HOME, /usr/local/cuda-11.x, /usr/lib/nvidia-cuda-toolkit): install" \
        "NVIDIA's cuda-toolkit-11-8, or on Debian 12 'apt-get install nvidia-cuda-toolkit' from non-free (README: GPUs)"
      # nvcc 11.x takes g++ <= 11 as its host compiler (Debian 12's g++ is 12): the whole build uses one
      if (( $(g++ -dumpversion | cut -d. -f1) > 11 )); then
        host=""
        for version in 11 10 9; do
          if command -v "g++-$version" >/dev/null 2>&1; then host=$version; break; fi
        done
        [[ -n $host ]] || die "nvcc of CUDA 11 needs g++ 11 or older as its host compiler, and this machine's g++" \
          "is $(g++ -dumpversion): install g++-11 (Debian 12: apt-get install g++-11)"
        export CC=gcc-$host CXX=g++-$host
      fi
      # nvcc runs ptxas, fatbinary and nvlink from PATH: the toolkit's own go first (Debian keeps them in
      # /usr/bin, which another CUDA's /usr/local/bin would shadow)
      tools=$cuda_home/bin
      if [[ ! -x $tools/ptxas && $cuda_home == /usr/lib/nvidia-cuda-toolkit ]]; then tools=/usr/bin; fi
      export PATH=$cuda_home/bin:$tools:$PATH
      mkdir -p "$source_dir/nccl-lib"
      ln -s "$SITE/nvidia/nccl/lib/libnccl.so.2" "$source_dir/nccl-lib/libnccl.so"
      export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME=$cuda_home HOROVOD_BUILD_CUDA_CC_LIST=50,60,70,80,86 \
             HOROVOD_NCCL_INCLUDE=$SITE/nvidia/nccl/include HOROVOD_NCCL_LIB=$source_dir/nccl-lib \
             HOROVOD_NCCL_LINK=SHARED
      nvcc_release=$("$cuda_home/bin/nvcc" --version | grep -o 'release [0-9.]*')
      log "horovod's CUDA build: nvcc of $cuda_home ($nvcc_release), host compiler ${CXX:-g++}"
    fi
    export MAKEFLAGS="-j$(nproc)"
    PATH="$VENV/bin:$PATH" "${PIP[@]}" wheel --no-deps --no-build-isolation --no-cache-dir \
        -w "$WHEEL_DIR" "$source_dir/horovod-$HOROVOD_VERSION" >>"$build_log" 2>&1 \
      || { tail -n 40 "$build_log" >&2; rm -f "$WHEEL_DIR"/*.whl;
           die "horovod build failed; full log: $build_log (see docs/troubleshooting.md)"; }
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
if [[ $GPU == 1 ]]; then
  grep -q '\[X\] NCCL' <<<"$check" || die "horovod was built without NCCL:\n$check\nDelete $WHEEL_DIR and re-run."
fi
if [[ $VARIANT == gloo-mpi* ]]; then
  grep -q '\[X\] MPI' <<<"$check" \
    || die "mpicxx is present but horovod lacks MPI:\n$check\nDelete $WHEEL_DIR and re-run."
fi

pip_quiet install --no-deps --no-build-isolation -e "$ROOT"
echo "$STAMP_WANT" > "$STAMP_FILE"
log "ready: $VENV (horovod $HOROVOD_VERSION, $VARIANT)"
