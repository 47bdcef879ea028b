"""guard_zones' check after a step: which canaries a step broke, among the buffers and the KV blocks."""
from __future__ import annotations

from ..kv.arena import KVArena
from ..model.buffers import GuardZones

GUARD_SWEEP_STEPS = 64          # every this many steps the KV guards of every block, not only the written ones


class GuardZoneError(RuntimeError):
    """A kernel wrote past a buffer or a KV block (guard_zones): memory is corrupt, stop."""


def guard_breach(guards: GuardZones, arena: KVArena, written: set, step: int, what_ran: str) -> str:
    """'' or what overwrote which canaries: the buffers' names, the step and what it ran. written:
    the KV blocks the step wrote (ModelRunner.blocks_written), checked every step; all of them
    every GUARD_SWEEP_STEPS steps."""
    blocks = None if step % GUARD_SWEEP_STEPS == 0 else written
    broken = guards.breaches() + [f"KV block {block} (layer {layer}, {'KV'[kind]}, kv head {head})"
                                  for layer, kind, block, head in arena.guard_breaches(blocks)[:8]]
    if not broken:
        return ""
    return (f"guard zone overwritten in step {step}, {what_ran} (kernels: decoder_layers, final norm, "
            f"output head): {', '.join(broken)}")
