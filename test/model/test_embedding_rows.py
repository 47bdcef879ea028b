"""The token embedding, where it is looked up in place (an untied, not repacked tensor: the 0.5B's
Q5_0, the 1.5B's Q4_K), is read from the file with pread (gguf_file.TensorRowReader): new token
ids bring none of the file's pages into the process, and the rows are the mapping's rows."""
import os
from pathlib import Path

import numpy as np
import pytest

from edge_slm_node.engine.memory import resident_by_mapping
from edge_slm_node.model.gguf_file import GGUFFile
from edge_slm_node.model.transformer import Transformer

MODEL_PATH = Path.home() / ".cache" / "edge_slm_node" / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


@pytest.fixture(scope="module")
def model():
    if not MODEL_PATH.is_file():
        pytest.skip(f"{MODEL_PATH} is not installed (edge-slm models install qwen2.5-coder-0.5b-instruct-q4_k_m)")
    from edge_slm_node.model.loader import load_model
    return load_model(str(MODEL_PATH))


def _file_resident_kib() -> int:
    real = os.path.realpath(MODEL_PATH)
    return sum(kib for name, kib in resident_by_mapping().items() if os.path.realpath(name) == real)


def test_embedding_any_ids_maps_no_file_page_and_gives_the_stored_rows(model):
    runner = Transformer(model.config, model.weights, max_batch_tokens=512, max_context=64, max_logits_rows=1)
    assert not runner.embedding_from_head and model.weights.embedding_rows is not None
    ids = np.arange(5, model.config.vocab_size, model.config.vocab_size // 512, dtype=np.int32)[:512]
    out = np.empty((ids.shape[0], model.config.hidden_size), np.float32)
    before = _file_resident_kib()
    runner.embed(ids, out)
    after = _file_resident_kib()
    assert after == before, f"the model file's resident pages went from {before} to {after} KiB"
    stored = model.weights.embedding_quant.dequantize(np.asarray(model.weights.embedding_raw[ids]))
    np.testing.assert_array_equal(out, stored.reshape(out.shape))
    assert _file_resident_kib() > after          # the same rows through the mapping do fault pages in


def test_row_reader_refuses_rows_outside_the_tensor_and_reads_the_rows_it_is_asked():
    if not MODEL_PATH.is_file():
        pytest.skip(f"{MODEL_PATH} is not installed")
    gguf = GGUFFile(str(MODEL_PATH))
    reader = gguf.row_reader("token_embd.weight")
    raw = gguf.tensor_bytes("token_embd.weight")
    out = np.empty((2, reader.row_bytes), np.uint8)
    reader.read(np.array([reader.num_rows - 1, 0], np.int32), out)
    np.testing.assert_array_equal(out, raw[[reader.num_rows - 1, 0]])
    for bad in (-1, reader.num_rows):
        with pytest.raises(IndexError, match=f"row {bad} of a tensor with {reader.num_rows} rows"):
            reader.read(np.array([bad], np.int32), out[:1])
