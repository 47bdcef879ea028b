"""ros2 launch edge_slm_node edge_slm.launch.py [params_file:=...] [namespace:=...]"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def generate_launch_description():
    default_params = os.path.join(get_package_share_directory("edge_slm_node"), "config", "edge_slm.yaml")
    return LaunchDescription([
        DeclareLaunchArgument("params_file", default_value=default_params,
                              description="YAML file with edge_slm_node ros__parameters"),
        DeclareLaunchArgument("namespace", default_value="",
                              description="namespace for the node's topics and services"),
        Node(
            package="edge_slm_node",
            executable="edge_slm_node",
            name="edge_slm_node",
            namespace=LaunchConfiguration("namespace"),
            parameters=[LaunchConfiguration("params_file")],
            output="screen",
            emulate_tty=True,
        ),
    ])
