"""GeGLU: our GELU table equals llama.cpp's (every entry), and geglu follows ggml_vec_geglu_f32."""
import hashlib
import json
from pathlib import Path

import numpy as np

from edge_slm_node.kernels.gelu import geglu, gelu_table

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "ggml_gelu_table.json").read_text())


def test_gelu_table_equals_ggml_table_gelu_f16():
    bits = gelu_table().astype(np.float16).view(np.uint16)
    assert bits[::257].tolist() == FIXTURE["every_257th"]
    assert hashlib.sha256(bits.tobytes()).hexdigest() == FIXTURE["sha256"]


def test_geglu_looks_up_the_fp16_rounded_input_and_passes_large_inputs_through():
    table = gelu_table()
    rng = np.random.default_rng(3)
    gate = np.concatenate([rng.standard_normal(500) * 3, [-10.0, -10.5, 10.0, 12.5, 0.0, -0.0, 9.99]]).astype(np.float32)
    up = rng.standard_normal(gate.shape[0]).astype(np.float32)
    out = np.zeros_like(gate)
    geglu(gate[None].copy(), up[None].copy(), out[None], table)
    index = gate.astype(np.float16).view(np.uint16)
    expected = np.where(gate <= -10, np.float32(0), np.where(gate >= 10, gate * up, table[index] * up))
    np.testing.assert_array_equal(out, expected.astype(np.float32))
    x = gate.astype(np.float64)                       # and it is GELU (tanh form) to fp16 precision
    exact = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    inside = np.abs(gate) < 10
    np.testing.assert_allclose((out / up)[inside], exact[inside], rtol=2e-3, atol=2e-4)
    shares = np.full_like(out, np.nan)                # a team's column shares (kernels/layers.py)
    geglu(gate[None].copy(), up[None].copy(), shares[None], table, 0, 200)
    assert np.isnan(shares[200:]).all()
    geglu(gate[None].copy(), up[None].copy(), shares[None], table, 200, gate.shape[0])
    np.testing.assert_array_equal(shares, out)
