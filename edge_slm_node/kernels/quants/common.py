"""What every weight type's matmul shares: one signature, the activation scratch, row groups,
the repacking loop, and the serial / thread-pool drivers.

Every type module exports matmul_serial and matmul_parallel with MATMUL_SIGNATURE:

    (packed u8 (groups, ·), tail u8 (rows % 8, ·), part_ends i64 (parts,), x f32 (T, K),
     scratch Scratch, outs 3 x f32 (T, rows_p))  ->  outs[p] = x @ W_p.T

W is one matrix or several concatenated ones sharing x (q|k|v, gate|up): part_ends[p] is the
number of row groups up to and including part p; unused outs are empty. Each kernel quantizes
x itself into `scratch` the way llama.cpp quantizes activations for that weight type. The
common signature lets the layer kernel (kernels/layers.py) call each matrix's kernel through
a function object, whatever its type.

The K-quant kernels sum a row in the order llama.cpp would use in the call that row belongs
to, which depends on that call's size (see q4_k.py, q6_k.py); scratch.call_index and
scratch.call_length (T,) say, per row of x, its index in and the length of that llama.cpp call
(a prompt's micro-batch, 1 for a decoded token), so a row's result does not depend on what
else shares the kernel call. set_one_call makes x one call of its T rows.
"""
from collections import namedtuple

import numpy as np
from numba import njit, prange, types

from ..quantize import quantize_rows_q8, scaled_group_sums
from ..simd import EXACT_BIAS
from ..team import member_share

ROWS_PER_GROUP = 8            # packed layouts interleave the weights of 8 rows (one vector lane each)
MAX_RANGES = 32               # a constant: numba.get_num_threads() in a kernel disables its disk cache
# A matmul runs on numba's thread pool only when it is big enough to repay waking the workers
# (~15 us idle, 40-70 us with the cores contended): this many bytes of weights (decode streams
# them from memory) or this many multiply-adds (prefill).
PARALLEL_MIN_BYTES = 1 << 20
PARALLEL_MIN_MACS = 4_000_000

# Flat buffers a kernel views as (T, ·) arrays: q8 / q16 / xf hold T x K values, scales / sums
# / isums T x K/16 (per-block figures; K-quant activations keep one per 16 values). A slot no
# weight type reading this input uses is empty.
# call_index / call_length: one value per row (token), whatever the width.
# team (2,) int64: (member, members): matmul_serial computes that member's share of the row groups
# (and the last member the tail rows), for a forward run by a team of threads (kernels/team.py);
# (0, 1), the default, is every row.
Scratch = namedtuple("Scratch", ["q8", "q16", "xf", "scales", "sums", "isums", "call_index", "call_length", "team"])
SLOT_DTYPES = {"q8": np.int8, "q16": np.int16, "xf": np.float32, "scales": np.float32, "sums": np.float32,
               "isums": np.int32, "call_index": np.int32, "call_length": np.int32}
CALL_SLOTS = ("call_index", "call_length")
PER_VALUE_SLOTS = ("q8", "q16", "xf")

_U8_2D = types.Array(types.uint8, 2, "C")
_F32_2D = types.Array(types.float32, 2, "C")
SCRATCH_TYPE = types.NamedTuple([types.Array(types.int8, 1, "C"), types.Array(types.int16, 1, "C"),
                                 types.Array(types.float32, 1, "C"), types.Array(types.float32, 1, "C"),
                                 types.Array(types.float32, 1, "C"), types.Array(types.int32, 1, "C"),
                                 types.Array(types.int32, 1, "C"), types.Array(types.int32, 1, "C"),
                                 types.Array(types.int64, 1, "C")], Scratch)
MATMUL_SIGNATURE = types.void(_U8_2D, _U8_2D, types.Array(types.int64, 1, "C"), _F32_2D, SCRATCH_TYPE,
                              types.UniTuple(_F32_2D, 3))


def new_scratch(max_tokens: int, length: int, slots, allocate=None, calls=None) -> Scratch:
    """Buffers for x (max_tokens, length) read by weights needing `slots`, touched now (no page
    fault mid-decode); the other slots empty. allocate(slot name, size, dtype) -> zeros already
    touched, if given (guard zones), replaces np.empty + fill. calls: (call_index, call_length)
    arrays to share with other scratches (one per row, set once per forward), else new ones."""
    def buffer(name):
        if name not in slots:
            return np.zeros(0, SLOT_DTYPES[name])
        size = max_tokens * (length if name in PER_VALUE_SLOTS else -(-length // 16))
        if allocate is not None:
            return allocate(name, size, SLOT_DTYPES[name])
        array = np.empty(size, SLOT_DTYPES[name])
        array.fill(0)
        return array
    if calls is None:
        calls = tuple((allocate(name, max_tokens, np.int32) if allocate is not None else np.zeros(max_tokens, np.int32))
                      for name in CALL_SLOTS)
    if min(len(array) for array in calls) < max_tokens:
        raise ValueError(f"call shape arrays hold {min(len(a) for a in calls)} rows, scratch is for {max_tokens}")
    return Scratch(*[buffer(name) for name in Scratch._fields[:-3]], *calls, team=np.array([0, 1], np.int64))


def set_team(scratch: Scratch, member: int, members: int) -> None:
    """The next matmul_serial calls with this scratch compute member's share of the rows (of members)."""
    if not 0 <= member < members:
        raise ValueError(f"team member {member} of {members}")
    scratch.team[0], scratch.team[1] = member, members


def set_one_call(scratch: Scratch, num_tokens: int) -> None:
    """Rows 0..num_tokens-1 of the next x are one llama.cpp call (as a prompt of that many tokens)."""
    if len(scratch.call_index) < num_tokens:
        raise ValueError(f"scratch holds call shapes of {len(scratch.call_index)} rows, x has {num_tokens}")
    scratch.call_index[:num_tokens] = np.arange(num_tokens, dtype=np.int32)
    scratch.call_length[:num_tokens] = num_tokens


def set_separate_calls(scratch: Scratch, num_tokens: int) -> None:
    """Rows 0..num_tokens-1 of the next x are each a call of one token (decoded tokens, output rows)."""
    if len(scratch.call_index) < num_tokens:
        raise ValueError(f"scratch holds call shapes of {len(scratch.call_index)} rows, x has {num_tokens}")
    scratch.call_index[:num_tokens] = 0
    scratch.call_length[:num_tokens] = 1


@njit(cache=True, inline="always")
def rows_of(slot, num_tokens, width):
    """The first num_tokens x width values of a scratch slot as a C-contiguous (T, width) view."""
    return slot[:num_tokens * width].reshape(num_tokens, width)


@njit(cache=True, inline="always")
def quantize_with_sums(x, scratch):
    """x (T, K) -> (int8 q, d per block, sum per block) in scratch: the activations of the types
    with a per-block min (Q4_1, Q5_1)."""
    num_tokens, length = x.shape
    xq = rows_of(scratch.q8, num_tokens, length)
    xd = rows_of(scratch.scales, num_tokens, length // 32)
    xs = rows_of(scratch.sums, num_tokens, length // 32)
    quantize_rows_q8(x, xq, xd, xs)
    return xq, xd, xs


@njit(cache=True, inline="always")
def quantize_with_offsets(x, scratch, offset):
    """x (T, K) -> (int8 q, EXACT_BIAS + offset x the sum of each 4 consecutive q (int32), d per
    block) in scratch: the activations of the types whose signed weights are stored as unsigned
    ones with `offset` taken off (Q5_0: -16, Q8_0: -128); lanes.wide_block_offset starts its
    integer dots there."""
    num_tokens, length = x.shape
    xq = rows_of(scratch.q8, num_tokens, length)
    xd = rows_of(scratch.scales, num_tokens, length // 32)
    quantize_rows_q8(x, xq, xd, rows_of(scratch.sums, num_tokens, length // 32))
    offsets = rows_of(scratch.q16.view(np.int32), num_tokens, length // 4)
    scaled_group_sums(xq, offset, EXACT_BIAS, offsets)
    return xq, offsets, xd


@njit(cache=True, inline="always")
def locate(part_ends, group):
    """-> (part index, first output column) of a group of concatenated parts."""
    part = 0
    while group >= part_ends[part]:
        part += 1
    first = part_ends[part - 1] if part > 0 else 0
    return part, (group - first) * ROWS_PER_GROUP


@njit(cache=True, inline="always")
def run_serial(prepare, groups, tail_rows, packed, tail, part_ends, x, scratch, outs):
    """prepare(x, scratch) -> activations; groups(first, last, packed, acts, outs, part_ends);
    tail_rows(tail, acts, outs, part_ends) (rows after the last group, in the last part): the
    matmul on the calling thread, or its team member's share of it (scratch.team).
    A compiled function called per row group with a view such as packed[i] costs a call and an
    incref/decref pair (locked instructions, though each member's refcounts are its own: every
    unboxing makes its own meminfo): the Q4_x/Q5_x/Q8_0 tiles are inlined into their `groups`, and
    of the K-quant ones only the 4-token decode tiles, as inlining all of them took the package's
    first compile from ~2 to ~9 minutes for no further gain (README, "Per-group tiles inlined")."""
    acts = prepare(x, scratch)
    first, last = team_share(scratch, packed.shape[0])
    groups(first, last, packed, acts, outs, part_ends)
    if last == packed.shape[0]:
        tail_rows(tail, acts, outs, part_ends)


@njit(cache=True, inline="always")
def team_share(scratch, count):
    """-> (first, last): scratch.team's member's contiguous share of range(count); the last member's ends at count."""
    return member_share(scratch.team[0], scratch.team[1], count, 1)


@njit(cache=True, inline="always")
def run_parallel(prepare, groups, tail_rows, packed, tail, part_ends, x, scratch, outs):
    """The same with row groups split into contiguous ranges over numba's thread pool, when the
    call is big enough (PARALLEL_MIN_BYTES / PARALLEL_MIN_MACS); else on the calling thread."""
    acts = prepare(x, scratch)
    num_groups = packed.shape[0]
    macs = x.shape[0] * x.shape[1] * (num_groups * ROWS_PER_GROUP + tail.shape[0])
    if packed.size < PARALLEL_MIN_BYTES and macs < PARALLEL_MIN_MACS:
        groups(0, num_groups, packed, acts, outs, part_ends)
    else:
        ranges = max(1, min(num_groups, MAX_RANGES))
        for c in prange(ranges):
            groups(c * num_groups // ranges, (c + 1) * num_groups // ranges, packed, acts, outs, part_ends)
    tail_rows(tail, acts, outs, part_ends)


@njit(cache=True)
def pack_groups(raw, packed, type_size, scale_bytes, chunk_bytes):
    """Interleave raw's first groups*8 rows (GGUF blocks of type_size bytes: scale_bytes of fp16
    scales, then payload) into packed (groups, blocks * 8 * type_size): per block, each scale of
    the 8 rows side by side, then the payload in chunks of chunk_bytes, row after row."""
    rows = ROWS_PER_GROUP
    half_bytes = 2 * rows
    payload_start = scale_bytes // 2 * half_bytes
    for g in range(packed.shape[0]):
        for r in range(rows):
            source = raw[g * rows + r]
            for b in range(raw.shape[1] // type_size):
                src = b * type_size
                dst = b * rows * type_size
                for s in range(scale_bytes // 2):
                    packed[g, dst + s * half_bytes + 2 * r] = source[src + 2 * s]
                    packed[g, dst + s * half_bytes + 2 * r + 1] = source[src + 2 * s + 1]
                for c in range((type_size - scale_bytes) // chunk_bytes):
                    at = dst + payload_start + c * rows * chunk_bytes + r * chunk_bytes
                    for k in range(chunk_bytes):
                        packed[g, at + k] = source[src + scale_bytes + c * chunk_bytes + k]


def repack(raw: np.ndarray, type_size: int, scale_bytes: int, chunk_bytes: int) -> tuple:
    """GGUF rows (rows, nb*type_size) u8 -> (packed (rows//8, nb*8*type_size), tail (rows%8, ·)):
    the same bytes, so the packed form is exactly as large as the stored one."""
    groups = raw.shape[0] // ROWS_PER_GROUP
    packed = np.empty((groups, raw.shape[1] * ROWS_PER_GROUP), np.uint8)
    pack_groups(raw, packed, type_size, scale_bytes, chunk_bytes)
    return packed, np.array(raw[groups * ROWS_PER_GROUP:], dtype=np.uint8, order="C")


def dequantize_halves(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 stored at byte `start` of each block (n, type_size) -> (n, 1) float32."""
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def nibbles(payload: np.ndarray) -> np.ndarray:
    """GGUF nibble bytes (n, 16): weight j in the low nibble of byte j, j+16 in the high one -> (n, 32)."""
    return np.concatenate([payload & 0x0F, payload >> 4], axis=1).astype(np.float32)
