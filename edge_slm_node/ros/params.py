"""ROS parameters -> frozen, validated settings. Out-of-range values stop the node at start."""
from __future__ import annotations

from dataclasses import dataclass

from ..engine.config import ConfigError, EngineConfig
from ..engine.config_files import read_system_prompt
from ..engine.sampling import SamplingParams

# name -> (default, comment); the same names and defaults as config/edge_slm.yaml
PARAMETERS = {
    "model_path": ("", "GGUF file or known model name (edge-slm models); empty = bundled SmolLM2-135M-Instruct Q4_1"),
    "kv_pool_mb": (64.0, "KV arena size in MiB; 0 = size from the memory budget"),
    "block_size": (16, "tokens per KV block"),
    "max_sessions": (16, "sessions alive at once"),
    "max_context_tokens": (2048, "per session: system prompt + history + answer"),
    "max_new_tokens": (256, "default answer length when a command says 0"),
    "temperature": (0.0, "default temperature when a command says < 0; 0 = greedy"),
    "top_k": (40, "default top-k when a command says 0"),
    "top_p": (0.95, "default top-p when a command says <= 0"),
    "repetition_penalty": (1.0, "1 = off"),
    "system_prompt_file": ("", "empty = bundled config/cnc_system_prompt.txt"),
    "auto_create_sessions": (True, "a command for an unknown session creates it"),
    "status_rate_hz": (1.0, "pool_status and /diagnostics rate"),
    "session_idle_timeout_s": (1800.0, "idle sessions are destroyed after this; 0 = never"),
    "auto_session_idle_timeout_s": (300.0, "the same for sessions a command created; 0 = never"),
    "num_threads": (2, "compute threads for the model"),
    "lock_memory": (False, "mlock weights + KV pool + buffers (never swapped); needs CAP_IPC_LOCK or RLIMIT_MEMLOCK"),
    "qos_depth": (50, "queue depth of command / tokens topics"),
    "service_queue_depth": (100, "requests each session service holds (keep-all: none dropped)"),
    "service_rate_limit_hz": (50.0, "session service calls per second (all services); beyond: an error"),
    "max_queued_requests": (64, "commands waiting for the engine, all sessions"),
    "max_pending_per_session": (8, "commands waiting behind a busy session"),
    "queue_timeout_s": (30.0, "a command waiting longer for KV blocks fails"),
    "max_input_chars": (16384, "longest command text"),
    "memory_cap_fraction": (0.70, "weights + KV + runtime must fit in this share of MemAvailable"),
    "memory_reserve_fraction": (0.05, "share of MemAvailable always left free"),
}


@dataclass(frozen=True)
class NodeSettings:
    engine: EngineConfig
    defaults: SamplingParams
    auto_create_sessions: bool
    status_rate_hz: float
    session_idle_timeout_s: float
    auto_session_idle_timeout_s: float
    qos_depth: int
    service_queue_depth: int
    service_rate_limit_hz: float
    memory_cap_fraction: float
    memory_reserve_fraction: float
    kv_pool_auto: bool


def settings_from_values(values: dict) -> NodeSettings:
    """values: parameter name -> value (as declared). Raises ConfigError naming the parameter."""
    def require(name, ok, rule):
        if not ok:
            raise ConfigError(f"parameter {name}={values[name]!r} {rule}")

    require("status_rate_hz", 0 < values["status_rate_hz"] <= 100, "must be in (0, 100]")
    require("session_idle_timeout_s", values["session_idle_timeout_s"] >= 0, "must be >= 0 (0 = never)")
    require("auto_session_idle_timeout_s", values["auto_session_idle_timeout_s"] >= 0, "must be >= 0 (0 = never)")
    require("service_queue_depth", 1 <= values["service_queue_depth"] <= 100000, "must be in [1, 100000]")
    require("service_rate_limit_hz", 0 < values["service_rate_limit_hz"] <= 100000, "must be in (0, 100000]")
    require("qos_depth", 1 <= values["qos_depth"] <= 10000, "must be in [1, 10000]")
    require("kv_pool_mb", values["kv_pool_mb"] >= 0, "must be >= 0 (0 = automatic)")
    require("memory_cap_fraction", 0 < values["memory_cap_fraction"] <= 1, "must be in (0, 1]")
    require("memory_reserve_fraction", 0 <= values["memory_reserve_fraction"] < 1, "must be in [0, 1)")
    require("max_new_tokens", values["max_new_tokens"] >= 1, "must be >= 1")
    try:
        system_prompt = read_system_prompt(values["system_prompt_file"])
    except (OSError, ValueError) as error:
        raise ConfigError(f"parameter system_prompt_file={values['system_prompt_file']!r}: {error}") from error
    engine = EngineConfig(
        model_path=values["model_path"], kv_pool_mb=values["kv_pool_mb"] or 1.0,
        block_size=values["block_size"], max_sessions=values["max_sessions"],
        max_context_tokens=values["max_context_tokens"], num_threads=values["num_threads"],
        system_prompt=system_prompt, max_queued_requests=values["max_queued_requests"],
        max_pending_per_session=values["max_pending_per_session"],
        queue_timeout_s=values["queue_timeout_s"], max_input_chars=values["max_input_chars"],
        max_new_tokens_limit=values["max_context_tokens"], lock_memory=bool(values["lock_memory"]),
    ).validate()
    defaults = SamplingParams(temperature=values["temperature"], top_k=values["top_k"], top_p=values["top_p"],
                              repetition_penalty=values["repetition_penalty"],
                              max_new_tokens=values["max_new_tokens"])
    try:
        defaults.validate(engine.max_new_tokens_limit)
    except ValueError as error:
        raise ConfigError(f"default sampling parameters: {error}") from error
    return NodeSettings(engine, defaults, bool(values["auto_create_sessions"]), float(values["status_rate_hz"]),
                        float(values["session_idle_timeout_s"]), float(values["auto_session_idle_timeout_s"]),
                        int(values["qos_depth"]), int(values["service_queue_depth"]),
                        float(values["service_rate_limit_hz"]),
                        float(values["memory_cap_fraction"]), float(values["memory_reserve_fraction"]),
                        kv_pool_auto=values["kv_pool_mb"] == 0)
