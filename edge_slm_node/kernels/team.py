"""Several threads on one forward pass: a spin barrier on a shared counter (numba intrinsics over
LLVM atomics), so the threads meet between matmuls without a thread-pool wake-up per kernel.

A team of `members` threads shares one `sync` array (int64, TEAM_SYNC_SIZE, zeroed before each
forward): sync[ARRIVALS] counts arrivals at barriers over the whole forward, sync[ABORTED] is set
by a member that waited longer than `patience` cycles for the others (a member that died or was
never started): every member then leaves its barriers at once, and the caller raises. Each
member counts its own barriers (1, 2, ...), so barrier k is passed when arrivals reach k x members.
A waiting member spins with `pause`, and after SPINS_BEFORE_YIELD spins yields its core on each
turn (sched_yield), so a team on a loaded machine degrades instead of burning the core the late
member needs.
Note: numba's cache does not notice edits to this file; clear __pycache__ after changing it.
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .simd import _has_features

ARRIVALS, ABORTED = 0, 8        # on separate cache lines
TEAM_SYNC_SIZE = 16
SPINS_BEFORE_YIELD = 20_000
_I64 = ir.IntType(64)


def new_sync() -> np.ndarray:
    return np.zeros(TEAM_SYNC_SIZE, np.int64)


def _slot(context, builder, arr_type, arr, index_type, index):
    data = context.make_array(arr_type)(context, builder, arr).data
    return builder.gep(data, [context.cast(builder, index, index_type, types.intp)])


def _is_sync(arr, index) -> bool:
    return (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int64
            and isinstance(index, types.Integer))


@intrinsic
def atomic_add(typingctx, arr, index, value):
    """arr[index] += value as one sequentially consistent atomic step; -> the value before."""
    if not (_is_sync(arr, index) and isinstance(value, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _slot(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return builder.atomic_rmw("add", p, context.cast(builder, args[2], sig.args[2], types.int64), "seq_cst")
    return types.int64(arr, index, value), codegen


@intrinsic
def atomic_load(typingctx, arr, index):
    """arr[index], read atomically (acquire): a later read sees what was written before the store."""
    if not _is_sync(arr, index):
        return None

    def codegen(context, builder, sig, args):
        p = _slot(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return builder.load_atomic(p, "acquire", 8)
    return types.int64(arr, index), codegen


@intrinsic
def atomic_store(typingctx, arr, index, value):
    """arr[index] = value, atomically (release)."""
    if not (_is_sync(arr, index) and isinstance(value, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _slot(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        builder.store_atomic(context.cast(builder, args[2], sig.args[2], types.int64), p, "release", 8)
        return context.get_dummy_value()
    return types.none(arr, index, value), codegen


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (llvm.readcyclecounter: rdtsc on x86)."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, []), "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@intrinsic
def spin_pause(typingctx):
    """One turn of a spin-wait: `pause` on x86 (lets the other hyperthread run), else nothing."""
    def codegen(context, builder, sig, args):
        if _has_features(context, "sse2"):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def yield_core(typingctx):
    """sched_yield(2): give the core to another runnable thread (resolved by symbol, so cacheable)."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
        builder.call(fn, [])
        return context.get_dummy_value()
    return types.none(), codegen


@njit(cache=True, inline="always")
def member_share(member, members, count, align):
    """-> (first, last): member's contiguous share of range(count) among `members`, cut at
    multiples of align; the last member's ends at count."""
    units = count // align
    first = units * member // members * align
    last = count if member == members - 1 else units * (member + 1) // members * align
    return first, last


@njit(cache=True, nogil=True)
def barrier(sync, members, number, patience):
    """Barrier `number` (this member's count, from 1) of a team of `members`; -> False when the
    team is aborted (by this member after `patience` cycles of waiting, or by another)."""
    if members == 1:
        return True
    atomic_add(sync, ARRIVALS, 1)
    target = number * members
    spins = 0
    started = cycles()
    while atomic_load(sync, ARRIVALS) < target:
        if atomic_load(sync, ABORTED) != 0:
            return False
        spins += 1
        if spins < SPINS_BEFORE_YIELD:
            spin_pause()
        else:
            yield_core()
            if cycles() - started > patience:
                atomic_store(sync, ABORTED, 1)
                return False
    return atomic_load(sync, ABORTED) == 0
