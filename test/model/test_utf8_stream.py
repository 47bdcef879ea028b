"""Utf8StreamDecoder: pieces never split a character, whatever the token boundaries."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edge_slm_node.model.utf8_stream import Utf8StreamDecoder

CHINESE = "主轴转速设为一万二千转，进给一千五百毫米每分钟。"
EMOJI = "机器人🤖 完成 ✅ 👩‍🔧🛠️"


def stream(tokenizer, ids, **options):
    decoder = Utf8StreamDecoder(tokenizer, **options)
    pieces = [decoder.feed(token_id) for token_id in ids]
    return pieces, decoder.flush()


def test_chinese_and_emoji_split_across_tokens_come_out_whole(smollm2_tokenizer):
    for text in (CHINESE, EMOJI):
        ids = smollm2_tokenizer.encode(text)
        split = [i for i in ids if _is_partial(smollm2_tokenizer.token_bytes(i))]
        assert split, f"expected tokens holding partial characters in {text!r}"
        pieces, rest = stream(smollm2_tokenizer, ids)
        assert "".join(pieces) + rest == text
        assert rest == ""
        assert "\ufffd" not in "".join(pieces)
        assert "" in pieces  # at least one token completed no character yet


def _is_partial(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_each_piece_is_emitted_as_soon_as_complete(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("🤖")
    decoder = Utf8StreamDecoder(smollm2_tokenizer)
    pieces = [decoder.feed(token_id) for token_id in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1)
    assert pieces[-1] == "🤖"
    assert decoder.pending_bytes == b""


def test_incomplete_tail_is_held_then_replaced_on_flush(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("ok 🤖")
    decoder = Utf8StreamDecoder(smollm2_tokenizer)
    text = "".join(decoder.feed(token_id) for token_id in ids[:-1])
    assert text == "ok "
    assert decoder.pending_bytes == "🤖".encode()[: len(decoder.pending_bytes)] != b""
    assert decoder.flush() == "\ufffd"
    assert decoder.pending_bytes == b""
    assert decoder.feed(smollm2_tokenizer.encode("a")[0]) == "a"  # usable after flush


def test_invalid_bytes_become_replacement_characters():
    class Bytes:
        def token_bytes(self, token_id, skip_special=False):
            return [b"\x80", b"a", b"\xe4\xb8", b"b"][token_id]

    decoder = Utf8StreamDecoder(Bytes())
    assert decoder.feed(0) == "\ufffd"  # a stray continuation byte can never become valid
    assert decoder.feed(1) == "a"
    assert decoder.feed(2) == ""  # start of a 3-byte character
    assert decoder.feed(3) == "\ufffdb"  # broken by an ASCII byte
    assert decoder.flush() == ""


def test_skip_special_hides_control_tokens(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("hi<|im_end|>")
    assert "".join(stream(smollm2_tokenizer, ids)[0]) == "hi<|im_end|>"
    assert "".join(stream(smollm2_tokenizer, ids, skip_special=True)[0]) == "hi"


def test_reset_drops_pending_bytes(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("🤖")
    decoder = Utf8StreamDecoder(smollm2_tokenizer)
    decoder.feed(ids[0])
    decoder.reset()
    assert decoder.pending_bytes == b"" and decoder.flush() == ""


PARTS = ["a", " ", "é", "主轴", "🤖", "👩‍🔧", "G01 X-3.25", "\n", "ß∑"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PARTS), max_size=20))
def test_streamed_text_equals_decoded_text(smollm2_tokenizer, parts):
    text = "".join(parts)
    ids = smollm2_tokenizer.encode(text)
    pieces, rest = stream(smollm2_tokenizer, ids)
    assert "".join(pieces) + rest == smollm2_tokenizer.decode(ids) == text
    for piece in pieces:
        piece.encode("utf-8")  # every piece is valid text on its own (no lone surrogates)
        assert "\ufffd" not in piece
