#!/usr/bin/env bash
# The yardstick: llama-cpp-python (builds llama.cpp from source, ~10-25 min on 2 cores) in its own
# venv so it never touches the project's. Idempotent. Usage: bash bench/setup_reference.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REF="${EDGE_SLM_REFERENCE_VENV:-$ROOT/bench/.refvenv}"
if [ ! -x "$REF/bin/python" ] || ! "$REF/bin/python" -c "import llama_cpp" 2>/dev/null; then
    python3 -m venv "$REF"
    "$REF/bin/pip" install -q --disable-pip-version-check "llama-cpp-python==0.3.36" numpy
fi
echo "$REF/bin/python"
