#!/usr/bin/env bash
# Runs the test suite in the set-up environment: `bash scripts/test.sh [pytest args]`
# (no args: the whole suite under test/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
. "$ROOT/scripts/env.sh"
cd "$ROOT"
"$ROOT/.venv/bin/python" "$ROOT/scripts/clean_dds_shm.py"     # half-made segments of killed processes hang new nodes
[ $# -gt 0 ] || set -- test
# An intermittent segfault of the test process in rclpy's destroy_node is not understood yet
# (README, "Tests"): let a crash leave a core and print its native backtraces before failing.
ulimit -c unlimited 2>/dev/null || true
rm -f "$ROOT"/core "$ROOT"/core.[0-9]*
status=0
"$ROOT/.venv/bin/python" -m pytest -q "$@" || status=$?
if [ "$status" -gt 128 ]; then
    for core in "$ROOT"/core "$ROOT"/core.[0-9]*; do
        [ -f "$core" ] || continue
        if command -v gdb > /dev/null; then
            echo "[test] native backtraces of the crashed test process ($core):"
            gdb -batch -nx -ex "bt 40" -ex "thread apply all bt 12" "$ROOT/.venv/bin/python" "$core" 2>&1 \
                | grep -v "^warning: " | tail -n 600 || true
        fi
        rm -f "$core"
    done
fi
exit "$status"
