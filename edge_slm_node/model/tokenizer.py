"""Tokenizer built from a GGUF's own vocabulary, tokenizing like llama.cpp.

The ``tokenizers`` library does the work. ``tokenizer.ggml.model`` = gpt2 (byte-level BPE): a
BPE model over ``tokenizer.ggml.tokens`` and ``tokenizer.ggml.merges``, the pre-tokenizer
regexes llama.cpp uses for ``tokenizer.ggml.pre`` (see ``vocab_rules``) followed by the GPT-2
byte-to-unicode mapping. ``llama`` (SentencePiece: tokens with scores, byte fallback): the BPE
model of ``spm_backend``. Either way the control / user-defined tokens are registered as added
tokens so they are found in text. Decoding does not use ``tokenizers``: every token's raw bytes
are precomputed, as llama.cpp's ``token_to_piece`` returns them (control tokens render as their text).
"""
from __future__ import annotations

import os
import threading
from typing import Any, Iterable, Mapping, Optional, Union

from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models, pre_tokenizers

from edge_slm_node.model import spm_backend
from edge_slm_node.model import vocab_rules as rules
from edge_slm_node.model.gguf_metadata import metadata_from_reader, read_metadata

_KEY = "tokenizer.ggml."
_NAMED_ID_KEYS = {
    "bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id", "eom": "eom_token_id",
    "fim_pad": "fim_pad_token_id", "fim_rep": "fim_rep_token_id", "fim_sep": "fim_sep_token_id",
}


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's reversible byte -> printable character map, inverted: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    char_to_byte = {chr(byte): byte for byte in printable}
    next_code_point = 256
    for byte in range(256):
        if byte not in printable:
            char_to_byte[chr(next_code_point)] = byte
            next_code_point += 1
    return char_to_byte


class _ByteLevelDecoder:
    """Byte-level token text -> raw bytes, one C-level translate per token."""

    def __init__(self) -> None:
        self.char_to_byte = byte_level_alphabet()
        self.alphabet = frozenset(self.char_to_byte)
        self.table = {ord(char): chr(byte) for char, byte in self.char_to_byte.items()}

    def __call__(self, text: str) -> bytes:
        if self.alphabet.issuperset(text):
            return text.translate(self.table).encode("latin-1")
        # not byte-level encoded: characters outside the alphabet are taken as UTF-8
        return b"".join(
            bytes([self.char_to_byte[char]]) if char in self.alphabet else char.encode("utf-8", "surrogateescape")
            for char in text
        )


class Tokenizer:
    """encode/decode with a GGUF vocabulary (byte-level BPE or SentencePiece); ids match llama.cpp's."""

    def __init__(
        self,
        tokens: list[str],
        token_types: list[int],
        merges: list[str],
        pre: str = "default",
        named_ids: Optional[Mapping[str, Optional[int]]] = None,
        add_bos: Optional[bool] = None,
        model: str = "gpt2",
        scores: Optional[list[float]] = None,
        add_space_prefix: Optional[bool] = None,
    ) -> None:
        if model not in rules.SUPPORTED_TOKENIZER_MODELS:
            raise ValueError(f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); supported: "
                             f"{list(rules.SUPPORTED_TOKENIZER_MODELS)}")
        self.model = model
        self.spm = model == "llama"
        if self.spm:                         # llama.cpp ignores tokenizer.ggml.pre for SentencePiece
            pre = "default"
            if scores is None:
                raise ValueError("a SentencePiece vocabulary needs tokenizer.ggml.scores")
        if pre not in rules.PRE_TOKENIZERS:
            raise ValueError(
                f"unsupported pre-tokenizer {pre!r} (tokenizer.ggml.pre); supported: {sorted(rules.PRE_TOKENIZERS)}"
            )
        if not tokens:
            raise ValueError("vocabulary is empty (tokenizer.ggml.tokens)")
        if len(token_types) != len(tokens):
            raise ValueError(f"{len(token_types)} token types for {len(tokens)} tokens (tokenizer.ggml.token_type)")
        rule = rules.PRE_TOKENIZERS[pre]
        self.pre = pre
        self.vocab_size = len(tokens)
        self._tokens = list(tokens)
        text_to_id = {text: token_id for token_id, text in enumerate(tokens)}  # later duplicate wins
        named = {name: None for name in _NAMED_ID_KEYS}
        named.update(named_ids or {})
        for name, token_id in named.items():
            if token_id is not None and not 0 <= token_id < self.vocab_size:
                raise ValueError(f"{name} token id {token_id} is outside the vocabulary of {self.vocab_size} tokens")
        self.bos_id: Optional[int] = named["bos"]
        self.eos_id: Optional[int] = named["eos"]
        default_bos = rules.SPM_DEFAULT_ADD_BOS if self.spm else rule.add_bos
        self.add_bos_default: bool = default_bos if add_bos is None else bool(add_bos)
        self.add_space_prefix = self.spm and (rules.SPM_DEFAULT_ADD_SPACE_PREFIX if add_space_prefix is None
                                              else bool(add_space_prefix))
        self.eog_ids: frozenset[int] = rules.end_of_generation_ids(self._tokens, text_to_id, named)

        types = list(token_types)
        for token_id in text_to_id.values():  # llama.cpp turns EOG/FIM-looking tokens into control tokens
            if self._tokens[token_id] in rules.FORCED_CONTROL_TEXTS and types[token_id] != rules.TOKEN_TYPE_CONTROL:
                types[token_id] = rules.TOKEN_TYPE_CONTROL
        special_types = (rules.TOKEN_TYPE_CONTROL, rules.TOKEN_TYPE_UNKNOWN)
        self._special_ids = frozenset(i for i, kind in enumerate(types) if kind in special_types)
        self._token_bytes = self._build_token_bytes(types)
        self._backend = self._build_backend(text_to_id, types, merges, rule, scores)
        self._lock = threading.Lock()

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_metadata(cls, fields: Mapping[str, Any]) -> "Tokenizer":
        """Build from GGUF metadata as returned by ``read_metadata`` (key -> Python value)."""
        model = fields.get(_KEY + "model")
        if model not in rules.SUPPORTED_TOKENIZER_MODELS:
            raise ValueError(
                f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); supported: "
                f"{list(rules.SUPPORTED_TOKENIZER_MODELS)}"
            )
        spm = model == "llama"
        for key in ("tokens", "token_type", "scores" if spm else "merges"):
            if _KEY + key not in fields:
                raise ValueError(f"GGUF metadata has no {_KEY + key}")
        named_ids = {
            name: None if fields.get(_KEY + key) is None else int(fields[_KEY + key])
            for name, key in _NAMED_ID_KEYS.items()
        }
        # llama.cpp's defaults for a vocabulary that names no bos/eos
        default_bos, default_eos = ((rules.SPM_DEFAULT_BOS_ID, rules.SPM_DEFAULT_EOS_ID) if spm
                                    else (rules.GPT2_DEFAULT_BOS_ID, rules.GPT2_DEFAULT_EOS_ID))
        if named_ids["bos"] is None and default_bos < len(fields[_KEY + "tokens"]):
            named_ids["bos"] = default_bos
        if named_ids["eos"] is None and default_eos < len(fields[_KEY + "tokens"]):
            named_ids["eos"] = default_eos
        return cls(
            tokens=list(fields[_KEY + "tokens"]),
            token_types=[int(kind) for kind in fields[_KEY + "token_type"]],  # list or numpy array
            merges=list(fields.get(_KEY + "merges") or []),
            pre=fields.get(_KEY + "pre") or "default",  # llama.cpp falls back to 'default'
            named_ids=named_ids,
            add_bos=fields.get(_KEY + "add_bos_token"),
            model=model,
            scores=fields.get(_KEY + "scores"),
            add_space_prefix=fields.get(_KEY + "add_space_prefix"),
        )

    @classmethod
    def from_gguf(cls, path: Union[str, os.PathLike]) -> "Tokenizer":
        return cls.from_metadata(read_metadata(path))

    @classmethod
    def from_gguf_reader(cls, reader: Any) -> "Tokenizer":
        return cls.from_metadata(metadata_from_reader(reader))

    def _build_token_bytes(self, types: list[int]) -> list[bytes]:
        byte_level = _ByteLevelDecoder()
        table = []
        for text, kind in zip(self._tokens, types):
            if kind == rules.TOKEN_TYPE_NORMAL:
                table.append(spm_backend.spm_piece(text) if self.spm else byte_level(text))
            elif kind in (rules.TOKEN_TYPE_CONTROL, rules.TOKEN_TYPE_UNKNOWN, rules.TOKEN_TYPE_USER_DEFINED):
                table.append(text.encode("utf-8", "surrogateescape"))
            elif kind == rules.TOKEN_TYPE_BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                table.append(bytes([int(text[3:5], 16)]))
            elif kind == rules.TOKEN_TYPE_BYTE:
                table.append(byte_level(text))
            else:  # unused / undefined render as nothing (llama.cpp token_to_piece)
                table.append(b"")
        return table

    def _build_backend(self, text_to_id: dict[str, int], types: list[int], merges: list[str], rule,
                       scores: Optional[list[float]]) -> BackendTokenizer:
        if self.spm:
            backend = BackendTokenizer(spm_backend.spm_model(self._tokens, scores, text_to_id))
            backend.normalizer = spm_backend.spm_normalizer(self.add_space_prefix)
        else:
            backend = self._byte_level_backend(text_to_id, merges, rule)
        special, user_defined = [], []
        for token_id in sorted(set(text_to_id.values())):
            text, kind = self._tokens[token_id], types[token_id]
            if not text:
                continue
            if token_id in self._special_ids:
                special.append(AddedToken(text, special=True, normalized=False))
            elif kind == rules.TOKEN_TYPE_USER_DEFINED:
                user_defined.append(AddedToken(text, special=False, normalized=False))
        backend.add_special_tokens(special)
        backend.add_tokens(user_defined)
        for added in special + user_defined:
            assert backend.token_to_id(added.content) == text_to_id[added.content], added.content
        return backend

    @staticmethod
    def _byte_level_backend(text_to_id: dict[str, int], merges: list[str], rule) -> BackendTokenizer:
        merge_pairs = []
        for index, merge in enumerate(merges):
            pair = merge.split(" ", 1) if merge[:1] != " " else merge[1:].split(" ", 1)
            if len(pair) != 2:
                raise ValueError(f"merge {index} {merge!r} has no space separating its two parts")
            if merge[:1] == " ":  # as llama.cpp: split at the first space after position 0
                pair[0] = " " + pair[0]
            merge_pairs.append((pair[0], pair[1]))
        try:
            model = models.BPE(
                vocab=text_to_id, merges=merge_pairs, ignore_merges=rule.ignore_merges,
                fuse_unk=False, byte_fallback=False,
            )
        except Exception as error:  # tokenizers raises its own exception type for bad merges
            raise ValueError(f"cannot build BPE model from the GGUF vocabulary: {error}") from error
        backend = BackendTokenizer(model)
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in rule.regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        return backend

    # ---- API ----------------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; control tokens written in the text become their ids unless
        ``parse_special`` is False (user-defined tokens always do, as in llama.cpp)."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        with self._lock:
            self._backend.encode_special_tokens = not parse_special
            ids = self._backend.encode(text, add_special_tokens=False).ids
            self._backend.encode_special_tokens = False
        if add_bos:
            if self.bos_id is None:
                raise ValueError("add_bos requested but the vocabulary has no BOS token")
            ids.insert(0, self.bos_id)
        return ids

    def encode_segments(self, segments: Iterable[tuple[str, bool]]) -> list[int]:
        """Token ids of the concatenated texts, control tokens parsed only in segments marked
        True. Control tokens split the text into runs as llama.cpp's special-token partition
        does; each run (which may span segments) is tokenized as a whole, without parsing."""
        pieces: list = []                     # str runs and control-token ids, in order
        for text, parse_special in segments:
            if not parse_special:
                pieces.append(text)
                continue
            with self._lock:
                encoding = self._backend.encode(text, add_special_tokens=False)
            cursor = 0
            for token_id, (start, end) in zip(encoding.ids, encoding.offsets):
                if token_id in self._special_ids:
                    pieces.append(text[cursor:start])
                    pieces.append(token_id)
                    cursor = end
            pieces.append(text[cursor:])
        ids: list[int] = []
        run: list[str] = []
        for piece in pieces + [None]:
            if isinstance(piece, str):
                run.append(piece)
                continue
            if run and "".join(run):
                ids += self.encode("".join(run), parse_special=False)
            run = []
            if piece is not None:
                ids.append(piece)
        return ids

    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        """Raw bytes of one token (may be part of a UTF-8 character); b"" for control
        tokens when ``skip_special``."""
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary of {self.vocab_size} tokens")
        if skip_special and token_id in self._special_ids:
            return b""
        return self._token_bytes[token_id]

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of ``ids``; bytes that are not valid UTF-8 become U+FFFD."""
        data = b"".join(self.token_bytes(int(token_id), skip_special) for token_id in ids)
        return data.decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        """The vocabulary entry as stored in the GGUF (byte-level encoded for normal tokens)."""
        self.token_bytes(token_id)  # range check
        return self._tokens[token_id]

    def is_special(self, token_id: int) -> bool:
        """True for control/unknown tokens (those llama.cpp hides when rendering text)."""
        return token_id in self._special_ids

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    @property
    def special_ids(self) -> frozenset:
        """Control / unknown token ids (never produced by encoding text with parse_special False)."""
        return self._special_ids

    def all_token_bytes(self) -> list[bytes]:
        """Every token's raw bytes, indexed by id (control tokens as their text)."""
        return list(self._token_bytes)

    def __repr__(self) -> str:
        return (
            f"Tokenizer(model={self.model!r}, pre={self.pre!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, eog_ids={sorted(self.eog_ids)}, add_bos_default={self.add_bos_default})"
        )
