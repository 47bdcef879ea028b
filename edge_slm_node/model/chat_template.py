"""Render a GGUF's ``tokenizer.chat_template`` (a Jinja2 template, as in Hugging Face).

The environment matches what transformers' ``apply_chat_template`` and llama-cpp-python's
``Jinja2ChatFormatter`` use: an immutable sandbox with ``trim_blocks`` and ``lstrip_blocks``,
the ``loopcontrols`` extension, ``{% generation %}`` blocks rendered as plain content, a
``raise_exception(message)`` helper, ``strftime_now(format)``
and a ``tojson`` filter that keeps non-ASCII text. Variables: ``messages``, ``bos_token``,
``eos_token``, ``add_generation_prompt`` plus any extra keyword arguments of ``render``.

Fallback: a GGUF without ``tokenizer.chat_template`` gets ``GEMMA_TEMPLATE`` when its vocabulary
has ``<start_of_turn>`` (llama.cpp's built-in "gemma" format, e.g. Gemma 3 270M), else
``CHATML_TEMPLATE`` -- plain ChatML (``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message,
then ``<|im_start|>assistant\\n`` when a generation prompt is asked for), with no default system prompt.

The ``trim`` filter also trims text between the content markers of ``chat_prompt`` (CONTENT_START
... CONTENT_END), so a template that trims a message gives the same prompt marked or not.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Optional, Sequence

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

CONTENT_START, CONTENT_END = "\ufdd0", "\ufdd1"      # noncharacters around client text (chat_prompt)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# llama.cpp's LLM_CHAT_TEMPLATE_GEMMA (llm_chat_apply_template) as Jinja: no system role, the system
# text (trimmed) opens the first user turn followed by a blank line; "assistant" is "model";
# contents trimmed of C isspace characters; BOS first, as tokenizing with add_bos does.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% set system = namespace(text='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% set system.text = system.text + (message['content'] | trim(' \\t\\n\\v\\f\\r')) %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{% if system.text and role != 'model' %}{{ system.text + '\\n\\n' }}{% set system.text = '' %}{% endif %}"
    "{{ (message['content'] | trim(' \\t\\n\\v\\f\\r')) + '<end_of_turn>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}`` (a transformers training marker) renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)  # the tag name
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class ChatTemplateError(ValueError):
    """The template rejected the conversation (``raise_exception``) or failed to render."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(date_format: str) -> str:
    return datetime.now().strftime(date_format)


def _trim(value: Any, chars: Optional[str] = None) -> str:
    """Jinja's trim; a marked content (chat_prompt) is trimmed inside its markers."""
    text = str(value)
    if len(text) >= 2 and text[0] == CONTENT_START and text[-1] == CONTENT_END:
        return CONTENT_START + text[1:-1].strip(chars) + CONTENT_END
    return text.strip(chars)


class ChatTemplate:
    """``ChatTemplate(template_str, bos_token, eos_token).render(messages)`` -> prompt text."""

    def __init__(self, template_str: Optional[str], bos_token: str = "", eos_token: str = "",
                 fallback: str = CHATML_TEMPLATE) -> None:
        self.uses_fallback = not template_str
        self.source = fallback if self.uses_fallback else template_str
        self.bos_token = bos_token
        self.eos_token = eos_token
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationBlock]
        )
        environment.filters["tojson"] = _tojson
        environment.filters["trim"] = _trim
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        try:
            self._template = environment.from_string(self.source)
        except jinja2.TemplateSyntaxError as error:
            raise ChatTemplateError(f"chat template does not parse: {error.message} (line {error.lineno})") from error

    @classmethod
    def from_metadata(cls, fields: Mapping[str, Any]) -> "ChatTemplate":
        """From GGUF metadata: ``tokenizer.chat_template`` and the bos/eos token texts."""
        tokens = fields.get("tokenizer.ggml.tokens") or []

        def token_text(key: str) -> str:
            token_id = fields.get(key)
            return tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else ""

        return cls(
            fields.get("tokenizer.chat_template"),
            bos_token=token_text("tokenizer.ggml.bos_token_id"),
            eos_token=token_text("tokenizer.ggml.eos_token_id"),
            fallback=GEMMA_TEMPLATE if "<start_of_turn>" in tokens else CHATML_TEMPLATE,
        )

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text for ``messages`` (each a mapping with str ``role`` and ``content``)."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
        checked = []
        for index, message in enumerate(messages):
            if not isinstance(message, Mapping):
                raise ChatTemplateError(f"message {index} must be a dict, got {type(message).__name__}")
            for key in ("role", "content"):
                if not isinstance(message.get(key), str):
                    raise ChatTemplateError(
                        f"message {index} needs a str {key!r}, got {type(message.get(key)).__name__}"
                    )
            checked.append(dict(message))
        variables = dict(extra)
        variables.update(
            messages=checked, bos_token=self.bos_token, eos_token=self.eos_token,
            add_generation_prompt=bool(add_generation_prompt),
        )
        try:
            return self._template.render(**variables)
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as error:
            raise ChatTemplateError(f"chat template failed to render: {type(error).__name__}: {error}") from error
