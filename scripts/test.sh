#!/usr/bin/env bash
# Runs the test suite in the set-up environment: `bash scripts/test.sh [pytest args]`
# (no args: the whole suite under test/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
. "$ROOT/scripts/env.sh"
cd "$ROOT"
[ $# -gt 0 ] || set -- test
exec "$ROOT/.venv/bin/python" -m pytest -q "$@"
