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
exec "$ROOT/.venv/bin/python" -m pytest -q "$@"
