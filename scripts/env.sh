# Source this file (bash or sh): `. scripts/env.sh`
# Puts the repo's .venv (with `ros2` when scripts/setup.sh installed the ROS 2 command line),
# the colcon install spaces (this package; composition_interfaces for `ros2 launch`) and the
# source tree (first, so edits to Python sources are live) on the search paths.
if [ -n "${BASH_SOURCE:-}" ]; then
    EDGE_SLM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
elif [ -z "${EDGE_SLM_ROOT:-}" ]; then
    EDGE_SLM_ROOT="$(pwd)"   # plain sh cannot tell the sourced file's path
fi
export EDGE_SLM_ROOT
_esn_venv="$EDGE_SLM_ROOT/.venv"
_esn_prefix="$EDGE_SLM_ROOT/install/edge_slm_node"
_esn_site="$_esn_prefix/lib/python3.11/site-packages"
for _esn_d in "$_esn_prefix"/lib/python3*/site-packages; do
    [ -d "$_esn_d" ] && _esn_site="$_esn_d"
done

# prepend VAR DIR: put DIR first in the colon list VAR, dropping an older copy of it
# (plain sh, and safe under `set -euo pipefail` in the script that sources this file)
_esn_prepend() {
    eval "_esn_old=\${$1:-}"
    _esn_new="$2"
    _esn_ifs="$IFS"
    IFS=:
    for _esn_p in $_esn_old; do
        if [ -n "$_esn_p" ] && [ "$_esn_p" != "$2" ]; then
            _esn_new="$_esn_new:$_esn_p"
        fi
    done
    IFS="$_esn_ifs"
    export "$1=$_esn_new"
}

export VIRTUAL_ENV="$_esn_venv"
_esn_prepend PATH "$_esn_venv/bin"
# launch_ros imports composition_interfaces, built by setup.sh step 8 when the ROS 2 tools are there
_esn_iface="$EDGE_SLM_ROOT/install/composition_interfaces"
if [ -d "$_esn_iface" ]; then
    _esn_prepend AMENT_PREFIX_PATH "$_esn_iface"
    _esn_prepend LD_LIBRARY_PATH "$_esn_iface/lib"
    for _esn_d in "$_esn_iface"/lib/python3*/site-packages; do
        [ -d "$_esn_d" ] && _esn_prepend PYTHONPATH "$_esn_d"
    done
fi
_esn_prepend AMENT_PREFIX_PATH "$_esn_venv"
_esn_prepend AMENT_PREFIX_PATH "$_esn_prefix"
_esn_prepend CMAKE_PREFIX_PATH "$_esn_venv"
# the generated typesupport libraries are looked up on LD_LIBRARY_PATH at run time;
# the ROS wheels' own libraries are added by ros_wheels_bootstrapper when python starts
_esn_prepend LD_LIBRARY_PATH "$_esn_prefix/lib"
_esn_prepend PYTHONPATH "$_esn_site"
_esn_prepend PYTHONPATH "$EDGE_SLM_ROOT"
export RMW_IMPLEMENTATION="${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}"
unset _esn_venv _esn_iface _esn_prefix _esn_site _esn_d _esn_old _esn_new _esn_ifs _esn_p
unset -f _esn_prepend
