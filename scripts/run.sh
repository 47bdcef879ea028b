#!/usr/bin/env bash
# Sets everything up (idempotent) and starts the node with the bundled model and config/edge_slm.yaml.
#   bash scripts/run.sh [launch arguments, e.g. namespace:=cell3 log_level:=debug]
# Through `ros2 launch edge_slm_node edge_slm.launch.py` when launch_ros is installed (setup.sh step 8),
# else the node's own entry (then extra arguments are ROS arguments: --ros-args ...).
# Then, in another terminal:  . scripts/env.sh && edge_slm_client --session cell3 "Why is spindle 2 alarming?"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
. "$ROOT/scripts/env.sh"
if command -v ros2 >/dev/null 2>&1 && "$ROOT/.venv/bin/python" -c 'import launch_ros.actions' 2>/dev/null; then
    exec ros2 launch edge_slm_node edge_slm.launch.py params_file:="$ROOT/config/edge_slm.yaml" "$@"
fi
exec "$ROOT/.venv/bin/python" -m edge_slm_node.ros.node --ros-args --params-file "$ROOT/config/edge_slm.yaml" "$@"
