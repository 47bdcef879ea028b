"""ros2 launch edge_slm_node edge_slm.launch.py [namespace:=cell3] [params_file:=...] [autostart:=true]
[log_level:=info] [use_respawn:=false]

The arguments are named as in Nav2's bringup. autostart:=false leaves the managed (lifecycle) node
unconfigured until a lifecycle manager or `ros2 lifecycle set <node> configure` / `activate` brings it up.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

RESPAWN_DELAY_S = 2.0


def generate_launch_description():
    default_params = os.path.join(get_package_share_directory("edge_slm_node"), "config", "edge_slm.yaml")
    namespace = LaunchConfiguration("namespace")
    params_file = LaunchConfiguration("params_file")
    autostart = LaunchConfiguration("autostart")
    log_level = LaunchConfiguration("log_level")
    use_respawn = LaunchConfiguration("use_respawn")
    return LaunchDescription([
        DeclareLaunchArgument("namespace", default_value="",
                              description="namespace for the node's topics, services and action"),
        DeclareLaunchArgument("params_file", default_value=default_params,
                              description="YAML file with edge_slm_node ros__parameters"),
        DeclareLaunchArgument("autostart", default_value="true",
                              description="configure and activate the lifecycle node at start"),
        DeclareLaunchArgument("log_level", default_value="info", description="ROS log level"),
        DeclareLaunchArgument("use_respawn", default_value="false",
                              description=f"restart the node {RESPAWN_DELAY_S:g} s after it exits"),
        Node(
            package="edge_slm_node",
            executable="edge_slm_node",
            name="edge_slm_node",
            namespace=namespace,
            parameters=[params_file, {"autostart": autostart}],
            arguments=["--ros-args", "--log-level", log_level],
            respawn=use_respawn,
            respawn_delay=RESPAWN_DELAY_S,
            output="screen",
            emulate_tty=True,
        ),
    ])
