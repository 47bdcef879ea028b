"""GeGLU as llama.cpp's CPU backend computes it (GGML_GELU_FP16): GELU in its tanh form, looked
up in a table indexed by the input rounded to fp16, the table's values rounded to fp16.

ggml builds the table once (ggml_cpu_init) from 0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f +
GELU_COEF_A*x*x))) with the inner a*b + 1 contracted to one FMA by the compiler; float64 tanh
rounded to float32 gives the same fp16 values (test/kernels/test_gelu.py compares every entry
with the table read out of llama.cpp's libggml-cpu)."""
import numpy as np
from numba import njit

from .half import half_bits

_GELU_COEF_A = np.float32(0.044715)
_SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)


def gelu_table() -> np.ndarray:
    """(65536,) f32: for every fp16 bit pattern h, fp16(gelu(h)) as float32 (ggml_table_gelu_f16)."""
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        cubic = ((_GELU_COEF_A * x).astype(np.float64) * x + 1.0).astype(np.float32)     # fmaf(A*x, x, 1)
        inner = (_SQRT_2_OVER_PI * x) * cubic
        tanh = np.tanh(inner.astype(np.float64)).astype(np.float32)
        gelu = (np.float32(0.5) * x) * (np.float32(1.0) + tanh)
    nan = np.isnan(gelu)        # NaN and -inf inputs: ggml's table holds the quiet NaN with the input's sign
    gelu[nan] = np.copysign(np.float32(np.nan), x[nan])
    return gelu.astype(np.float16).astype(np.float32)


@njit(cache=True, nogil=True)
def geglu(gate, up, out, table, first=0, last=-1):
    """gate, up (T, n) -> out (T, n) = gelu(gate) * up as ggml_vec_geglu_f32, in columns
    first..last-1 only (last < 0: to n); table from gelu_table()."""
    num_tokens, n = gate.shape
    last = n if last < 0 else last
    for t in range(num_tokens):
        for i in range(first, last):
            x = gate[t, i]
            if x <= np.float32(-10.0):
                out[t, i] = np.float32(0.0)
            elif x >= np.float32(10.0):
                out[t, i] = x * up[t, i]
            else:
                out[t, i] = table[half_bits(x)] * up[t, i]
