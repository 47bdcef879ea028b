"""/diagnostics as diagnostic_updater publishes it: one status per concern, each named
"<node name>: <concern>" with the hardware_id set, levels OK / WARN / ERROR / STALE."""
from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

OK, WARN, ERROR, STALE = (DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR,
                          DiagnosticStatus.STALE)


def _status(node_name, hardware_id, concern, level, message, values) -> DiagnosticStatus:
    return DiagnosticStatus(level=level, name=f"{node_name}: {concern}", message=message, hardware_id=hardware_id,
                            values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])


def kv_pool_status(stats) -> tuple:
    if stats is None:
        return STALE, "no KV pool (node not configured)", {}
    used = f"KV pool {stats.usage_ratio:.0%} used"
    level = ERROR if stats.usage_ratio > 0.95 else WARN if stats.usage_ratio > 0.80 else OK
    return level, used, {"total_blocks": stats.total_blocks, "free_blocks": stats.free_blocks,
                         "used_blocks": stats.used_blocks, "cached_blocks": stats.cached_blocks,
                         "shared_blocks": stats.shared_blocks, "block_size": stats.block_size,
                         "kv_mb_in_use": f"{stats.kv_bytes_in_use / 2**20:.1f}", "preemptions": stats.preemptions}


def queue_status(stats, max_queued_requests: int) -> tuple:
    if stats is None:
        return STALE, "no engine (node not configured)", {}
    waiting = stats.queue_length
    message = f"{waiting} queued (limit {max_queued_requests}), {stats.running} running"
    level = ERROR if waiting >= max_queued_requests else WARN if 2 * waiting >= max_queued_requests else OK
    return level, message, {"queue_length": waiting, "max_queued_requests": max_queued_requests,
                            "running": stats.running, "sessions": len(stats.sessions),
                            "sessions_evicted": stats.sessions_evicted}


def engine_status(stats, lifecycle_state: str, loading: str, failure: str, model_path: str, rss_bytes: int) -> tuple:
    """loading: the model-loading stage while configure runs ("" otherwise)."""
    values = {"lifecycle_state": lifecycle_state, "rss_mb": f"{rss_bytes / 2**20:.1f}"}
    if loading:
        values["loading"] = loading
    if model_path:
        values["model_path"] = model_path
    if stats is not None:
        values.update(weights_mb=f"{stats.weights_bytes / 2**20:.1f}", locked_mb=f"{stats.locked_bytes / 2**20:.1f}")
    if failure:
        values["last_failure"] = failure
    if lifecycle_state == "active":
        return OK, "active: serving commands, services and goals", values
    if failure and lifecycle_state == "unconfigured":
        return ERROR, f"unconfigured: {failure}", values
    if loading:
        return WARN, f"{lifecycle_state}: loading {loading}", values
    return WARN, f"{lifecycle_state}: not serving", values


def diagnostics(stats, stamp, node_name: str, hardware_id: str, lifecycle_state: str, loading: str, failure: str,
                model_path: str, rss_bytes: int, max_queued_requests: int) -> DiagnosticArray:
    array = DiagnosticArray(status=[
        _status(node_name, hardware_id, "KV pool", *kv_pool_status(stats)),
        _status(node_name, hardware_id, "queue", *queue_status(stats, max_queued_requests)),
        _status(node_name, hardware_id, "engine", *engine_status(stats, lifecycle_state, loading, failure,
                                                                 model_path, rss_bytes)),
    ])
    array.header.stamp = stamp
    return array
