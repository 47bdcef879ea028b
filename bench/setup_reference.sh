#!/usr/bin/env bash
# The yardstick for bench/bench_speed.py, built natively for this CPU, outside the project's venv:
#   1. llama-cpp-python 0.3.36 compiled from source into bench/.refvenv
#   2. llama.cpp's own llama-bench, from the llama.cpp vendored in the same sdist, into bench/.llama-build
# Idempotent (a working build is kept); prints the reference python and the llama-bench path.
# Both builds take 10-30 minutes on 2 cores. Existing builds can be used instead:
#   EDGE_SLM_REFERENCE_VENV=/path/to/venv      a venv with llama-cpp-python 0.3.36 (native)
#   EDGE_SLM_LLAMA_BENCH=/path/to/llama-bench  a llama-bench built from the same llama.cpp
# (bench_speed.py reads the same two variables.) A path given that way is checked, never rebuilt.
# Usage: bash bench/setup_reference.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION=0.3.36
REF_VENV="${EDGE_SLM_REFERENCE_VENV:-$ROOT/bench/.refvenv}"
BUILD_DIR="$ROOT/bench/.llama-build"
LLAMA_BENCH="${EDGE_SLM_LLAMA_BENCH:-$BUILD_DIR/bin/llama-bench}"
SRC_DIR="$ROOT/bench/.llama-src"
JOBS="$(nproc 2>/dev/null || echo 2)"

log() { printf '[setup_reference] %s\n' "$*" >&2; }
die() { printf '[setup_reference] error: %s\n' "$*" >&2; exit 1; }

# --- compiler flags -------------------------------------------------------------------------
# GGML_NATIVE=ON compiles ggml with -march=native, so it uses every instruction set this CPU has
# (AVX2, FMA, AVX-512, VNNI here), as a user building llama.cpp on the machine gets it.
# Where the CPU reports AMX (the Intel Xeon of this KVM guest lists amx_tile/amx_int8/amx_bf16),
# -march=native also switches on ggml's AMX matmul, and that dies with SIGILL at its first
# `tilezero` on this guest (the hypervisor does not give the guest usable AMX tile state).
# -mno-amx-* turns only AMX off; everything else stays native. (Found and worked around in
# /work/ref/REPORT_reference.md; the same flags went into both builds there.)
NATIVE_FLAGS=""
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    NATIVE_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
CMAKE_FLAGS=(-DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release)
if [ -n "$NATIVE_FLAGS" ]; then
    CMAKE_FLAGS+=("-DCMAKE_C_FLAGS=$NATIVE_FLAGS" "-DCMAKE_CXX_FLAGS=$NATIVE_FLAGS")
fi

venv_ok() {  # the venv imports llama_cpp $VERSION and its build shows AVX2 and FMA
    [ -x "$REF_VENV/bin/python" ] || return 1
    env -i PATH=/usr/bin:/bin HOME="$HOME" "$REF_VENV/bin/python" - "$VERSION" <<'EOF' >/dev/null 2>&1
import sys
import llama_cpp
info = llama_cpp.llama_print_system_info().decode()
sys.exit(not (llama_cpp.__version__ == sys.argv[1] and "AVX2 = 1" in info and "FMA = 1" in info))
EOF
}

bench_ok() {
    [ -x "$LLAMA_BENCH" ] && env -i PATH=/usr/bin:/bin HOME="$HOME" "$LLAMA_BENCH" --help >/dev/null 2>&1
}

sdist() {  # -> path of the unpacked llama-cpp-python sdist (downloaded once)
    local unpacked="$SRC_DIR/llama_cpp_python-$VERSION"
    if [ ! -f "$unpacked/vendor/llama.cpp/CMakeLists.txt" ]; then
        mkdir -p "$SRC_DIR"
        log "pip download llama-cpp-python==$VERSION (sdist)"
        python3 -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
            "llama-cpp-python==$VERSION" -d "$SRC_DIR" >&2
        tar -xzf "$SRC_DIR/llama_cpp_python-$VERSION.tar.gz" -C "$SRC_DIR"
    fi
    [ -f "$unpacked/vendor/llama.cpp/CMakeLists.txt" ] || die "no vendor/llama.cpp in $unpacked"
    printf '%s' "$unpacked"
}

# --- 1. llama-cpp-python --------------------------------------------------------------------
if ! venv_ok; then
    [ -z "${EDGE_SLM_REFERENCE_VENV:-}" ] \
        || die "EDGE_SLM_REFERENCE_VENV=$REF_VENV has no working native llama-cpp-python $VERSION"
    src="$(sdist)"
    [ -x "$REF_VENV/bin/python" ] || python3 -m venv "$REF_VENV"
    # llama-cpp-python's own runtime dependencies (the build below is --no-deps)
    "$REF_VENV/bin/pip" install -q --disable-pip-version-check numpy typing-extensions diskcache jinja2
    # CMAKE_ARGS is split shell-style by scikit-build-core: quote the flags that hold spaces
    cmake_args=""
    for flag in "${CMAKE_FLAGS[@]}"; do cmake_args+="$(printf '%q ' "$flag")"; done
    log "building llama-cpp-python $VERSION natively into $REF_VENV (10-30 min; CMAKE_ARGS=$cmake_args)"
    CMAKE_ARGS="$cmake_args" FORCE_CMAKE=1 "$REF_VENV/bin/pip" install -q --disable-pip-version-check \
        --no-cache-dir --force-reinstall --no-deps "$src" >&2
    venv_ok || die "llama-cpp-python in $REF_VENV does not import or lacks AVX2/FMA"
fi

# --- 2. llama-bench from the same vendored llama.cpp ------------------------------------------
if ! bench_ok; then
    [ -z "${EDGE_SLM_LLAMA_BENCH:-}" ] || die "EDGE_SLM_LLAMA_BENCH=$LLAMA_BENCH does not run"
    src="$(sdist)"
    log "building llama-bench into $BUILD_DIR (about 7-30 min)"
    cmake -S "$src/vendor/llama.cpp" -B "$BUILD_DIR" "${CMAKE_FLAGS[@]}" \
        -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF > "$BUILD_DIR.configure.log" 2>&1 \
        || { tail -n 40 "$BUILD_DIR.configure.log" >&2; die "cmake configure failed"; }
    cmake --build "$BUILD_DIR" --target llama-bench -j "$JOBS" > "$BUILD_DIR.build.log" 2>&1 \
        || { tail -n 40 "$BUILD_DIR.build.log" >&2; die "llama-bench build failed (log $BUILD_DIR.build.log)"; }
    bench_ok || die "$LLAMA_BENCH does not run"
fi

echo "reference python: $REF_VENV/bin/python"
echo "llama-bench:      $LLAMA_BENCH"
