#!/usr/bin/env bash
# Runs the test suite in the set-up environment: `bash scripts/test.sh [pytest args]`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
. "$ROOT/scripts/env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest -q test "$@"
