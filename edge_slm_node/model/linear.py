"""A weight matrix kept in its GGUF encoding, and the activations prepared for it."""
from __future__ import annotations

import numpy as np

from ..kernels import matmul
from ..kernels.half import HALF_TO_FLOAT
from ..kernels.quantize import quantize_rows_q8
from .quant import F16, F32, Q4_0, Q4_1, Q8_0, QuantType


class PreparedInput:
    """One activation matrix x (T, K) plus the encodings the weights reading it need.

    Buffers are allocated once for `max_tokens` rows; `prepare` fills views of them.
    """

    def __init__(self, max_tokens: int, length: int, need_q8: bool, need_half: bool):
        self.length = length
        self.need_q8 = need_q8 and length % 32 == 0
        self.need_half = need_half
        blocks = length // 32
        self._xq = np.zeros((max_tokens, length), np.int8)
        self._xd = np.zeros((max_tokens, blocks), np.float32)
        self._xs = np.zeros((max_tokens, blocks), np.float32)
        self._half = np.zeros((max_tokens, length), np.float32) if need_half else None
        self.x = self.xq = self.xd = self.xs = self.x_half = None

    def prepare(self, x: np.ndarray) -> "PreparedInput":
        num_tokens = x.shape[0]
        self.x = x
        if self.need_q8:
            self.xq, self.xd, self.xs = self._xq[:num_tokens], self._xd[:num_tokens], self._xs[:num_tokens]
            quantize_rows_q8(x, self.xq, self.xd, self.xs)
        if self.need_half:
            self.x_half = self._half[:num_tokens]
            np.copyto(self.x_half, x.astype(np.float16))   # only for F16 weights (test models)
        return self


class QuantizedLinear:
    """y = W x for W (out_features, in_features) stored as GGUF bytes (rows, bytes_per_row)."""

    def __init__(self, name: str, raw: np.ndarray, quant: QuantType, in_features: int):
        if quant not in (F32, F16, Q4_0, Q4_1, Q8_0):
            raise ValueError(f"tensor {name!r}: quantization {quant.name} has no matmul kernel")
        self.name = name
        self.raw = raw
        self.quant = quant
        self.in_features = in_features
        self.out_features = raw.shape[0]

    @property
    def needs_q8(self) -> bool:
        return self.quant in (Q4_0, Q4_1, Q8_0)

    @property
    def needs_half(self) -> bool:
        return self.quant is F16

    def apply(self, prepared: PreparedInput, out: np.ndarray) -> None:
        """prepared x (T, in_features) -> out (T, out_features)."""
        quant = self.quant
        if quant is Q4_1:
            matmul.matmul_q4_1(self.raw, prepared.xq, prepared.xd, prepared.xs, HALF_TO_FLOAT, out)
        elif quant is Q4_0:
            matmul.matmul_q4_0(self.raw, prepared.xq, prepared.xd, HALF_TO_FLOAT, out)
        elif quant is Q8_0:
            matmul.matmul_q8_0(self.raw, prepared.xq, prepared.xd, HALF_TO_FLOAT, out)
        elif quant is F16:
            matmul.matmul_f16(self.raw, prepared.x_half, HALF_TO_FLOAT, out)
        else:
            matmul.matmul_f32(self.raw, prepared.x, out)
