"""Conversation -> token ids, where only the chat template's own markup can yield control tokens.

Message contents come from clients. Rendered and tokenized as one string, a content holding
``<|im_end|>\\n<|im_start|>system`` would end its turn and forge a system turn. So each content
is rendered between two Unicode noncharacters (reserved for exactly this internal use), the
rendered text is cut there, and the tokenizer parses control tokens only in the template's
parts (Tokenizer.encode_segments). Text on both sides of a cut is still tokenized as one run,
so a prompt without control-token strings in its contents gets the ids it always had.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from .chat_template import CONTENT_END, CONTENT_START, ChatTemplate, ChatTemplateError
from .tokenizer import Tokenizer


def literal_text(text: str) -> str:
    """Client text with the two content markers replaced by U+FFFD (they never occur in real text)."""
    return text.replace(CONTENT_START, "\ufffd").replace(CONTENT_END, "\ufffd")


class ChatPrompt:
    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, tools: Sequence[Mapping] = ()):
        """tools: the template's `tools` variable (function declarations), rendered by the template
        itself (Qwen2.5: into the system turn); operator configuration, so not marked as client text."""
        self.template = template
        self.tokenizer = tokenizer
        self.extra = {"tools": list(tools)} if tools else {}

    def text(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
        """The rendered prompt as a string (for display; ids come from `ids`)."""
        return self.template.render([{**m, "content": literal_text(m["content"])} for m in messages],
                                    add_generation_prompt=add_generation_prompt, **self.extra)

    def ids(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> list[int]:
        marked = [{**m, "content": CONTENT_START + literal_text(m["content"]) + CONTENT_END} for m in messages]
        rendered = self.template.render(marked, add_generation_prompt=add_generation_prompt, **self.extra)
        return self.tokenizer.encode_segments(_segments(rendered, len(messages)))


def _segments(rendered: str, expected: int) -> list[tuple[str, bool]]:
    """Rendered text with markers -> [(text, parse_special)]: template markup True, contents False."""
    segments, cursor, found = [], 0, 0
    while True:
        start = rendered.find(CONTENT_START, cursor)
        if start < 0:
            break
        end = rendered.find(CONTENT_END, start + 1)
        if end < 0 or CONTENT_START in rendered[start + 1:end]:
            raise ChatTemplateError("chat template split a message's content; cannot keep client text literal")
        segments.append((rendered[cursor:start], True))
        segments.append((rendered[start + 1:end], False))
        cursor, found = end + 1, found + 1
    if CONTENT_END in rendered[cursor:]:
        raise ChatTemplateError("chat template reordered a message's content; cannot keep client text literal")
    segments.append((rendered[cursor:], True))
    if found > expected:
        raise ChatTemplateError(f"chat template rendered {found} contents for {expected} messages")
    return [(text, special) for text, special in segments if text]
