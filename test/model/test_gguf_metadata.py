"""read_metadata / read_header against files written by gguf-py and against GGUFReader."""
from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from gguf import GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter

from edge_slm_node.model.gguf_metadata import metadata_from_reader, parse_header, read_header, read_metadata

VALUES = {
    "test.u8": (200, GGUFValueType.UINT8),
    "test.i8": (-100, GGUFValueType.INT8),
    "test.u16": (60000, GGUFValueType.UINT16),
    "test.i16": (-30000, GGUFValueType.INT16),
    "test.u32": (4_000_000_000, GGUFValueType.UINT32),
    "test.i32": (-2_000_000_000, GGUFValueType.INT32),
    "test.u64": (2**63 + 5, GGUFValueType.UINT64),
    "test.i64": (-(2**62), GGUFValueType.INT64),
    "test.f32": (0.25, GGUFValueType.FLOAT32),
    "test.f64": (1.0 / 3.0, GGUFValueType.FLOAT64),
    "test.bool": (True, GGUFValueType.BOOL),
    "test.str": ("G01 X12.5 你好 🤖", GGUFValueType.STRING),
}


def write_gguf(path, endianess=GGUFEndian.LITTLE, tensors=1):
    writer = GGUFWriter(str(path), "llama", endianess=endianess)
    for key, (value, value_type) in VALUES.items():
        writer.add_key_value(key, value, value_type)
    writer.add_array("test.strings", ["a", "", "ü", "<|im_end|>"])
    writer.add_array("test.ints", [1, -2, 3])
    writer.add_array("test.floats", [1.5, -2.25])
    writer.add_array("test.nested", [[1, 2], [3]])
    for index in range(tensors):
        writer.add_tensor(f"tensor_{index}", np.arange(32, dtype=np.float32) + index)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("endianess", [GGUFEndian.LITTLE, GGUFEndian.BIG])
def test_every_value_type_round_trips(tmp_path, endianess):
    header = read_header(write_gguf(tmp_path / "values.gguf", endianess))
    metadata = header.metadata
    assert header.version == 3 and header.tensor_count == 1
    assert header.byte_order == ("<" if endianess == GGUFEndian.LITTLE else ">")
    assert metadata["general.architecture"] == "llama"
    for key, (value, value_type) in VALUES.items():
        assert metadata[key] == pytest.approx(value) if isinstance(value, float) else metadata[key] == value
        assert type(metadata[key]) is type(value), key
        assert header.value_types[key] == (value_type,)
    assert metadata["test.strings"] == ["a", "", "ü", "<|im_end|>"]
    assert metadata["test.ints"] == [1, -2, 3] and all(type(v) is int for v in metadata["test.ints"])
    assert metadata["test.floats"] == [1.5, -2.25]
    assert metadata["test.nested"] == [[1, 2], [3]]
    assert header.value_types["test.nested"][:2] == (GGUFValueType.ARRAY, GGUFValueType.ARRAY)


def test_tensor_info_offset_points_at_first_tensor_name(tmp_path):
    path = write_gguf(tmp_path / "tensors.gguf", tensors=3)
    header = read_header(path)
    data = path.read_bytes()
    (name_length,) = struct.unpack_from("<Q", data, header.tensor_info_offset)
    start = header.tensor_info_offset + 8
    assert data[start:start + name_length] == b"tensor_0"
    assert header.tensor_count == 3


@pytest.mark.parametrize("endianess", [GGUFEndian.LITTLE, GGUFEndian.BIG])
def test_matches_gguf_reader_on_written_file(tmp_path, endianess):
    path = write_gguf(tmp_path / "reader.gguf", endianess)
    assert read_metadata(path) == metadata_from_reader(GGUFReader(str(path)))


def test_smollm2_metadata_matches_gguf_reader_and_is_fast(smollm2_gguf_path):
    started = time.perf_counter()
    header = read_header(smollm2_gguf_path)
    elapsed = time.perf_counter() - started
    metadata = header.metadata
    assert metadata["general.architecture"] == "llama"
    assert metadata["llama.block_count"] == 30
    assert metadata["llama.embedding_length"] == 576
    assert metadata["llama.attention.head_count"] == 9
    assert metadata["llama.attention.head_count_kv"] == 3
    assert len(metadata["tokenizer.ggml.tokens"]) == 49152
    assert len(metadata["tokenizer.ggml.token_type"]) == 49152
    assert metadata["tokenizer.ggml.tokens"][2] == "<|im_end|>"
    assert metadata["tokenizer.ggml.pre"] == "smollm"
    assert header.tensor_count == 272
    assert metadata == metadata_from_reader(GGUFReader(str(smollm2_gguf_path)))
    # generous bound (GGUFReader needs seconds); the real number is printed by `pytest -s`
    print(f"read_header(SmolLM2) took {elapsed * 1000:.0f} ms")
    assert elapsed < 3.0


def test_not_gguf_is_rejected(tmp_path):
    path = tmp_path / "plain.bin"
    path.write_bytes(b"GGML" + b"\0" * 64)
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_metadata(path)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        read_metadata(empty)


def test_unsupported_version_is_rejected():
    with pytest.raises(ValueError, match="unsupported GGUF version 7"):
        parse_header(b"GGUF" + struct.pack("<IQQ", 7, 0, 0))


@pytest.mark.parametrize("cut", [6, 20, 40, 150, 260])
def test_truncated_header_names_offset(tmp_path, cut):
    data = write_gguf(tmp_path / "full.gguf").read_bytes()
    with pytest.raises(ValueError, match="truncated|version"):
        parse_header(data[:cut])


def test_unknown_value_type_is_rejected():
    key = b"bad.key"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 99)
    with pytest.raises(ValueError, match="unknown value type 99"):
        parse_header(data)


def test_huge_string_length_is_rejected_not_allocated():
    key = b"k"
    data = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + key
            + struct.pack("<I", int(GGUFValueType.STRING)) + struct.pack("<Q", 2**62))
    with pytest.raises(ValueError, match="truncated or corrupt"):
        parse_header(data)


def test_empty_array():
    data = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"e"
            + struct.pack("<IIQ", int(GGUFValueType.ARRAY), int(GGUFValueType.INT32), 0))
    header = parse_header(data)
    assert header.metadata == {"e": []}
    assert header.tensor_info_offset == len(data)


def test_invalid_utf8_string_keeps_its_bytes():
    raw = b"ok\xff\xfe"
    data = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"s"
            + struct.pack("<I", int(GGUFValueType.STRING)) + struct.pack("<Q", len(raw)) + raw)
    value = parse_header(data).metadata["s"]
    assert value.encode("utf-8", "surrogateescape") == raw
