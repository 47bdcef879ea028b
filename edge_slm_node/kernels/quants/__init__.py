"""The one table of weight types: per type its GGUF block layout (from gguf-py's constants), and
the module that knows its packed layout, NumPy reference dequantizer and matmul kernels.

Adding a type = a module with FUSABLE, SCRATCH_SLOTS, dequantize, pack, matmul_serial and
matmul_parallel (MATMUL_SIGNATURE, see common.py), and one row below.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from . import f16, f32, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0


@dataclass(frozen=True)
class QuantType:
    ggml_type: GGMLQuantizationType
    kernels: ModuleType

    @property
    def name(self) -> str:
        return self.ggml_type.name

    @property
    def type_id(self) -> int:
        return int(self.ggml_type)

    @property
    def block_size(self) -> int:
        """Weights per block."""
        return GGML_QUANT_SIZES[self.ggml_type][0]

    @property
    def type_size(self) -> int:
        """Bytes per block."""
        return GGML_QUANT_SIZES[self.ggml_type][1]

    @property
    def fusable(self) -> bool:
        """Several matrices of this type sharing an input can run as one kernel call."""
        return self.kernels.FUSABLE

    def dequantize(self, raw: np.ndarray) -> np.ndarray:
        """NumPy reference: GGUF bytes (rows, bytes_per_row) -> float32 (rows, row_length)."""
        rows = raw.shape[0]
        return self.kernels.dequantize(np.ascontiguousarray(raw).reshape(-1, self.type_size)).reshape(rows, -1)

    def __repr__(self) -> str:
        return f"QuantType({self.name})"


_ROWS = [QuantType(GGMLQuantizationType.F32, f32), QuantType(GGMLQuantizationType.F16, f16),
         QuantType(GGMLQuantizationType.Q4_0, q4_0), QuantType(GGMLQuantizationType.Q4_1, q4_1),
         QuantType(GGMLQuantizationType.Q8_0, q8_0), QuantType(GGMLQuantizationType.Q5_0, q5_0),
         QuantType(GGMLQuantizationType.Q5_1, q5_1), QuantType(GGMLQuantizationType.Q4_K, q4_k),
         QuantType(GGMLQuantizationType.Q5_K, q5_k), QuantType(GGMLQuantizationType.Q6_K, q6_k)]
QUANT_TYPES: dict[int, QuantType] = {row.type_id: row for row in _ROWS}
F32, F16, Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K = _ROWS


class UnsupportedQuantError(ValueError):
    pass


def quant_type(type_id: int, tensor: str) -> QuantType:
    """The row for a GGUF tensor's type id; else an error naming the type, the tensor and the supported ones."""
    row = QUANT_TYPES.get(type_id)
    if row is not None:
        return row
    try:
        name = GGMLQuantizationType(type_id).name
    except ValueError:
        name = f"unknown type id {type_id}"
    raise UnsupportedQuantError(f"tensor {tensor!r} is stored as {name}, which this engine cannot run; supported: "
                                f"{', '.join(row.name for row in _ROWS)}")
