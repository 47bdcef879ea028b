#!/usr/bin/env bash
# Sets everything up (idempotent) and starts the node with the bundled model and config/edge_slm.yaml.
#   bash scripts/run.sh [--ros-args ...extra ROS arguments]
# Then, in another terminal:  . scripts/env.sh && edge_slm_client --session cell3 "Why is spindle 2 alarming?"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
. "$ROOT/scripts/env.sh"
exec "$ROOT/.venv/bin/python" -m edge_slm_node.ros.node --ros-args --params-file "$ROOT/config/edge_slm.yaml" "$@"
