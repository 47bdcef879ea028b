"""guard_zones' check after a step: which canaries a step broke, among the buffers and the KV blocks."""
from __future__ import annotations

from ..kv.arena import KVArena
from ..kv.block_manager import KVBlockManager
from ..model.buffers import GuardZones
from .plan import StepPlan

GUARD_SWEEP_STEPS = 64          # every this many steps the KV guards of every block, not only the written ones


class GuardZoneError(RuntimeError):
    """A kernel wrote past a buffer or a KV block (guard_zones): memory is corrupt, stop."""


def blocks_written(plan: StepPlan, kv: KVBlockManager, block_size: int) -> set:
    """The KV blocks a step writes: the next slot of each decoding sequence, every slot of each
    prompt chunk, the targets of its copies. Call before the step commits."""
    written = {dst for _, dst in plan.copies}
    for request in plan.decode:
        written.add(kv.block_table(request.session_id)[kv.num_tokens(request.session_id) // block_size])
    for chunk in plan.prompts:
        table = kv.block_table(chunk.request.session_id)
        written.update(table[position // block_size] for position in range(chunk.start, chunk.start + chunk.count,
                                                                           block_size))
        written.add(table[(chunk.start + chunk.count - 1) // block_size])
    return written


def guard_breach(guards: GuardZones, arena: KVArena, written: set, step: int, what_ran: str) -> str:
    """'' or what overwrote which canaries: the buffers' names, the step and what it ran."""
    blocks = None if step % GUARD_SWEEP_STEPS == 0 else written
    broken = guards.breaches() + [f"KV block {block} (layer {layer}, {'KV'[kind]}, kv head {head})"
                                  for layer, kind, block, head in arena.guard_breaches(blocks)[:8]]
    if not broken:
        return ""
    return (f"guard zone overwritten in step {step}, {what_ran} (kernels: decoder_layers, final norm, "
            f"output head): {', '.join(broken)}")
