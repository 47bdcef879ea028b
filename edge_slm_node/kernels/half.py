"""IEEE half-precision conversions for numba code (numba has no float16 type).

KV cache entries and GGUF block scales are stored as uint16 bit patterns.
"""
import math

import numpy as np
from numba import njit

from .ops import bits_float, float_bits

# f16 bits -> f32, one table entry per bit pattern (256 KiB; used for per-block scales).
HALF_TO_FLOAT = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)

_TWO_POW_112 = np.float32(2.0 ** 112)


@njit(cache=True, inline="always")
def half_to_float(h):
    """One fp16 bit pattern (uint16) -> float32, exact for finite values (subnormals included)."""
    w = np.uint32(h)
    bits = ((w & np.uint32(0x7FFF)) << np.uint32(13)) | ((w & np.uint32(0x8000)) << np.uint32(16))
    return bits_float(bits) * _TWO_POW_112


@njit(cache=True, inline="always")
def half_bits_to_float(bits_in, bits_scratch, out):
    """uint16 bits (n,) -> out float32 (n,); finite values only; bits_scratch is uint32 (n,)."""
    for i in range(bits_in.shape[0]):
        h = np.uint32(bits_in[i])
        bits_scratch[i] = ((h & np.uint32(0x7FFF)) << np.uint32(13)) | ((h & np.uint32(0x8000)) << np.uint32(16))
    as_float = bits_scratch.view(np.float32)
    for i in range(bits_in.shape[0]):
        # Rebias the exponent by multiplying: also handles subnormal halves exactly.
        out[i] = as_float[i] * _TWO_POW_112


@njit(cache=True, inline="always")
def float_to_half_bits(values, out):
    """float32 (n,) -> uint16 bits (n,), round to nearest even, overflow -> inf."""
    bits = values.view(np.uint32)
    for i in range(values.shape[0]):
        u = bits[i]
        sign = (u >> np.uint32(16)) & np.uint32(0x8000)
        u = u & np.uint32(0x7FFFFFFF)
        if u >= np.uint32(0x47800000):            # >= 65536 (or inf / nan)
            h = np.uint32(0x7E00) if u > np.uint32(0x7F800000) else np.uint32(0x7C00)
        elif u < np.uint32(0x38800000):           # below the smallest normal half: subnormal
            # value * 2^24 rounded to nearest even is the subnormal mantissa.
            magnitude = values[i] if values[i] >= 0 else -values[i]
            h = np.uint32(np.rint(np.float64(magnitude) * 16777216.0))
        else:
            mantissa_odd = (u >> np.uint32(13)) & np.uint32(1)
            u = u + np.uint32(0xC8000FFF) + mantissa_odd   # rebias exponent (-112 << 23) + round
            h = u >> np.uint32(13)
        out[i] = np.uint16(h | sign)


@njit(cache=True, inline="always")
def half_bits(value):
    """float32 scalar -> its fp16 bit pattern (uint16), round to nearest even, overflow -> inf."""
    u = np.uint32(float_bits(np.float32(value)))
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    u = u & np.uint32(0x7FFFFFFF)
    if u >= np.uint32(0x47800000):            # >= 65536 (or inf / nan)
        h = np.uint32(0x7E00) if u > np.uint32(0x7F800000) else np.uint32(0x7C00)
    elif u < np.uint32(0x38800000):           # below the smallest normal half: subnormal
        # value * 2^24 rounded to nearest even is the subnormal mantissa.
        magnitude = value if value >= 0 else -value
        h = np.uint32(np.rint(np.float64(magnitude) * 16777216.0))
    else:
        mantissa_odd = (u >> np.uint32(13)) & np.uint32(1)
        u = u + np.uint32(0xC8000FFF) + mantissa_odd   # rebias exponent (-112 << 23) + round
        h = u >> np.uint32(13)
    return np.uint16(h | sign)


@njit(cache=True, inline="always")
def round_to_half(value):
    """float32 scalar -> the same value rounded to fp16 precision (nearest even), as float32."""
    v = np.float64(value)
    magnitude = abs(v)
    if magnitude < 6.103515625e-05:                      # subnormal half: fixed step 2^-24
        return np.float32(np.rint(v * 16777216.0) / 16777216.0)
    mantissa, exponent = math.frexp(v)                    # v = mantissa * 2^exponent, 0.5 <= |m| < 1
    rounded = np.rint(mantissa * 2048.0) / 2048.0 * (2.0 ** exponent)
    if abs(rounded) > 65504.0:
        return np.float32(np.inf) if v > 0 else np.float32(-np.inf)
    return np.float32(rounded)
