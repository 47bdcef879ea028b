"""One side of test_service_qos.py, in its own process.

    python service_qos_peer.py server DELAY_S   # the session-service QoS; takes nothing for DELAY_S
    python service_qos_peer.py client N          # N calls at once, then waits for every reply
Prints one JSON line.
"""
import json
import sys
import time


def main():
    from edge_slm_node.ros.process_memory import configure_process_memory
    applied = configure_process_memory()               # as the node does, before rclpy starts
    import rclpy
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

    from edge_slm_node.ros.services import session_service_qos
    from edge_slm_node.srv import ResetSession
    rclpy.init()
    node = rclpy.create_node(f"service_qos_{sys.argv[1]}")
    if sys.argv[1] == "server":
        def answer(request, response):
            response.success, response.message = True, request.session_id
            return response
        node.create_service(ResetSession, "qos_probe", answer, qos_profile=session_service_qos(1000, node.get_logger()))
        print(json.dumps({"applied": applied}), flush=True)
        time.sleep(float(sys.argv[2]))                 # requests pile up in the middleware meanwhile
        rclpy.spin(node)
    else:
        replies = QoSProfile(depth=100, history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE)
        client = node.create_client(ResetSession, "qos_probe", qos_profile=replies)
        while not client.service_is_ready():
            rclpy.spin_once(node, timeout_sec=0.1)
        time.sleep(0.5)
        futures = [client.call_async(ResetSession.Request(session_id=str(i))) for i in range(int(sys.argv[2]))]
        deadline = time.monotonic() + 90
        while not all(f.done() for f in futures) and time.monotonic() < deadline:
            rclpy.spin_once(node, timeout_sec=0.05)
        print(json.dumps({"calls": len(futures), "answers": sum(f.done() for f in futures)}), flush=True)


if __name__ == "__main__":
    main()
