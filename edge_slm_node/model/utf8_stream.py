"""Turn a stream of token ids into text pieces that never split a UTF-8 character.

A byte-level BPE token can end in the middle of a multi-byte character (Chinese, emoji);
publishing each token's bytes decoded on its own would emit U+FFFD garbage. The decoder keeps
the incomplete tail until the next tokens complete it.

    decoder = Utf8StreamDecoder(tokenizer)
    for token_id in generated:
        piece = decoder.feed(token_id)   # "" while a character is incomplete
    rest = decoder.flush()               # incomplete trailing bytes -> U+FFFD
"""
from __future__ import annotations

import codecs
from typing import Protocol


class _HasTokenBytes(Protocol):
    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes: ...


class Utf8StreamDecoder:
    """Incremental token-id -> str decoder; every returned piece is complete, valid text.

    Bytes that can never become valid UTF-8 (e.g. a stray continuation byte) are replaced with
    U+FFFD as soon as that is certain; an incomplete sequence at the end is replaced by
    ``flush()``. With ``skip_special`` control tokens produce no text.
    """

    def __init__(self, tokenizer: _HasTokenBytes, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """Text completed by this token (possibly "")."""
        return self._decoder.decode(self._tokenizer.token_bytes(token_id, self._skip_special))

    def feed_bytes(self, data: bytes) -> str:
        return self._decoder.decode(data)

    @property
    def pending_bytes(self) -> bytes:
        """Bytes held back because they start an incomplete character."""
        return self._decoder.getstate()[0]

    def flush(self) -> str:
        """The held-back bytes (each invalid sequence -> U+FFFD); the decoder is then reset."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text

    def reset(self) -> None:
        """Drop held-back bytes without emitting them."""
        self._decoder.reset()
