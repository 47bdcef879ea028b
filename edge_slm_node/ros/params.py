"""ROS parameters -> frozen, validated settings.

Read-only parameters are fixed when the node starts (model, pool, threads, QoS, memory budget).
Run-time ones (sampling defaults, queue limits, timeouts, rates) can be changed with `ros2 param
set`: checked by the same rules as at start (runtime_from_values), effective from the next request.
The descriptor ranges are what `ros2 param describe` shows; rules a range cannot say (open
intervals, block sizes, cross-checks) are in the validators.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

from ..engine.config import ConfigError, EngineConfig
from ..engine.config_files import read_system_prompt
from ..engine.sampling import SamplingParams
from ..engine.tools import ToolsFileError, read_tools_file


@dataclass(frozen=True)
class ParameterSpec:
    default: object
    description: str
    low: Optional[float] = None          # inclusive range for the descriptor
    high: Optional[float] = None
    run_time: bool = False               # False: read-only, fixed at start


_S = ParameterSpec
# the same names and defaults as config/edge_slm.yaml
PARAMETERS = {
    "autostart": _S(True, "configure and activate at start (false: wait for lifecycle transitions)"),
    "model_path": _S("", "GGUF file or known model name (edge-slm models); empty = bundled SmolLM2-135M-Instruct Q4_1"),
    "kv_pool_mb": _S(64.0, "KV arena size in MiB; 0 = size from the memory budget", 0.0, 1048576.0),
    "block_size": _S(16, "tokens per KV block: 8, 16, 32 or 64", 8, 64),
    "max_sessions": _S(16, "sessions alive at once", 1, 1024),
    "max_context_tokens": _S(2048, "per session: system prompt + history + answer", 16, 32768),
    "max_new_tokens": _S(256, "default answer length when a command says 0", 1, 32768, True),
    "temperature": _S(0.0, "default temperature when a command says < 0; 0 = greedy", 0.0, 100.0, True),
    "top_k": _S(40, "default top-k when a command says 0; 0 = whole vocabulary", 0, 1048576, True),
    "top_p": _S(0.95, "default top-p when a command says <= 0; in (0, 1]", 0.0, 1.0, True),
    "repetition_penalty": _S(1.0, "default repetition penalty, in (0, 10]; 1 = off", 0.0, 10.0, True),
    "system_prompt_file": _S("", "empty = bundled config/cnc_system_prompt.txt"),
    "tools_file": _S("", "YAML file declaring the cell's tools (JSON-schema parameters); empty = no tools"),
    "auto_create_sessions": _S(True, "a command for an unknown session creates it", run_time=True),
    "status_rate_hz": _S(1.0, "pool_status and /diagnostics rate, in (0, 100]", 0.0, 100.0, True),
    "session_idle_timeout_s": _S(1800.0, "idle sessions are destroyed after this; 0 = never", 0.0, 1e9, True),
    "auto_session_idle_timeout_s": _S(300.0, "the same for sessions a command created; 0 = never", 0.0, 1e9,
                                      True),
    "num_threads": _S(2, "compute threads for the model", 1, 256),
    "lock_memory": _S(False, "mlock weights + KV pool + buffers (never swapped); needs CAP_IPC_LOCK or "
                             "RLIMIT_MEMLOCK"),
    "guard_zones": _S(False, "debug: canary bytes after every KV block and buffer, checked after every step; "
                             "an overwrite ends the process (exit 3) naming the buffer"),
    "prefix_kv_cache": _S(True, "keep the shared prompt's KV on disk (~/.cache/edge_slm_node/prefix_kv): a restart "
                                "skips its prefill"),
    "qos_depth": _S(50, "queue depth of command / tokens topics", 1, 10000),
    "service_queue_depth": _S(1000, "replies each session service keeps for slow clients (requests: keep-all)",
                              1, 100000),
    "service_rate_limit_hz": _S(50.0, "session service calls per second (all services); beyond: an error, "
                                      "in (0, 100000]", 0.0, 100000.0, True),
    "max_queued_requests": _S(64, "commands waiting for the engine, all sessions", 1, 100000, True),
    "max_pending_per_session": _S(8, "commands waiting behind a busy session", 1, 100000, True),
    "queue_timeout_s": _S(30.0, "a command waiting longer for KV blocks fails; > 0", 0.0, 1e6, True),
    "max_input_chars": _S(16384, "longest command text or system prompt", 1, 10000000),
    "max_goals": _S(4, "generate action goals executing at once; more are rejected", 1, 64),
    "memory_cap_fraction": _S(0.70, "weights + KV + runtime must fit in this share of MemAvailable", 0.0, 1.0),
    "memory_reserve_fraction": _S(0.05, "share of MemAvailable always left free", 0.0, 1.0),
    "hardware_id": _S("", "hardware_id of the /diagnostics statuses; empty = the host name"),
}
RUN_TIME_PARAMETERS = frozenset(name for name, spec in PARAMETERS.items() if spec.run_time)


def descriptor(name: str, spec: ParameterSpec) -> ParameterDescriptor:
    fixed = "" if spec.run_time else " (read-only: fixed at start)"
    result = ParameterDescriptor(name=name, description=spec.description + fixed, read_only=not spec.run_time)
    if spec.low is not None and not isinstance(spec.default, bool):
        if isinstance(spec.default, int):
            result.integer_range = [IntegerRange(from_value=int(spec.low), to_value=int(spec.high), step=1)]
        else:
            result.floating_point_range = [FloatingPointRange(from_value=float(spec.low),
                                                              to_value=float(spec.high), step=0.0)]
    return result


@dataclass(frozen=True)
class RuntimeSettings:
    """What `ros2 param set` may change while the node runs."""
    defaults: SamplingParams
    auto_create_sessions: bool
    status_rate_hz: float
    session_idle_timeout_s: float
    auto_session_idle_timeout_s: float
    service_rate_limit_hz: float
    max_queued_requests: int
    max_pending_per_session: int
    queue_timeout_s: float


@dataclass(frozen=True)
class NodeSettings:
    engine: EngineConfig
    runtime: RuntimeSettings
    qos_depth: int
    service_queue_depth: int
    memory_cap_fraction: float
    memory_reserve_fraction: float
    kv_pool_auto: bool
    max_goals: int


def _require(values: dict, name: str, ok: bool, rule: str) -> None:
    if not ok:
        raise ConfigError(f"parameter {name}={values[name]!r} {rule}")


def runtime_from_values(values: dict) -> RuntimeSettings:
    """values: every parameter name -> value. Raises ConfigError naming the parameter."""
    def require(name, ok, rule):
        _require(values, name, ok, rule)

    require("status_rate_hz", 0 < values["status_rate_hz"] <= 100, "must be in (0, 100]")
    require("session_idle_timeout_s", values["session_idle_timeout_s"] >= 0, "must be >= 0 (0 = never)")
    require("auto_session_idle_timeout_s", values["auto_session_idle_timeout_s"] >= 0, "must be >= 0 (0 = never)")
    require("service_rate_limit_hz", 0 < values["service_rate_limit_hz"] <= 100000, "must be in (0, 100000]")
    require("max_new_tokens", 1 <= values["max_new_tokens"] <= values["max_context_tokens"],
            f"must be in [1, max_context_tokens={values['max_context_tokens']}]")
    require("max_queued_requests", values["max_queued_requests"] >= 1, "must be >= 1")
    require("max_pending_per_session", values["max_pending_per_session"] >= 1, "must be >= 1")
    require("queue_timeout_s", values["queue_timeout_s"] > 0, "must be > 0")
    defaults = SamplingParams(temperature=values["temperature"], top_k=values["top_k"], top_p=values["top_p"],
                              repetition_penalty=values["repetition_penalty"],
                              max_new_tokens=values["max_new_tokens"])
    try:
        defaults.validate(values["max_context_tokens"])
    except ValueError as error:
        raise ConfigError(f"default sampling parameters: {error}") from error
    return RuntimeSettings(defaults, bool(values["auto_create_sessions"]), float(values["status_rate_hz"]),
                           float(values["session_idle_timeout_s"]), float(values["auto_session_idle_timeout_s"]),
                           float(values["service_rate_limit_hz"]), int(values["max_queued_requests"]),
                           int(values["max_pending_per_session"]), float(values["queue_timeout_s"]))


def settings_from_values(values: dict) -> NodeSettings:
    """values: every parameter name -> value (as declared). Raises ConfigError naming the parameter."""
    def require(name, ok, rule):
        _require(values, name, ok, rule)

    runtime = runtime_from_values(values)
    require("service_queue_depth", 1 <= values["service_queue_depth"] <= 100000, "must be in [1, 100000]")
    require("qos_depth", 1 <= values["qos_depth"] <= 10000, "must be in [1, 10000]")
    require("kv_pool_mb", values["kv_pool_mb"] >= 0, "must be >= 0 (0 = automatic)")
    require("memory_cap_fraction", 0 < values["memory_cap_fraction"] <= 1, "must be in (0, 1]")
    require("memory_reserve_fraction", 0 <= values["memory_reserve_fraction"] < 1, "must be in [0, 1)")
    require("max_goals", 1 <= values["max_goals"] <= 64, "must be in [1, 64]")
    try:
        system_prompt = read_system_prompt(values["system_prompt_file"])
    except (OSError, ValueError) as error:
        raise ConfigError(f"parameter system_prompt_file={values['system_prompt_file']!r}: {error}") from error
    try:
        tools = read_tools_file(values["tools_file"])
    except ToolsFileError as error:
        raise ConfigError(f"parameter tools_file: {error}") from error
    engine = EngineConfig(
        model_path=values["model_path"], kv_pool_mb=values["kv_pool_mb"] or 1.0,
        block_size=values["block_size"], max_sessions=values["max_sessions"],
        max_context_tokens=values["max_context_tokens"], num_threads=values["num_threads"],
        system_prompt=system_prompt, max_queued_requests=runtime.max_queued_requests,
        max_pending_per_session=runtime.max_pending_per_session,
        queue_timeout_s=runtime.queue_timeout_s, max_input_chars=values["max_input_chars"],
        max_new_tokens_limit=values["max_context_tokens"], lock_memory=bool(values["lock_memory"]),
        guard_zones=bool(values["guard_zones"]), tools=tools, prefix_kv_cache=bool(values["prefix_kv_cache"]),
    ).validate()
    return NodeSettings(engine, runtime, int(values["qos_depth"]), int(values["service_queue_depth"]),
                        float(values["memory_cap_fraction"]), float(values["memory_reserve_fraction"]),
                        kv_pool_auto=values["kv_pool_mb"] == 0, max_goals=int(values["max_goals"]))
