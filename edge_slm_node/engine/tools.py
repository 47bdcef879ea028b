"""The cell's tools: read from a YAML file, shown to the model through its chat template, and the
lazy grammar that constrains a tool call once the model opens one.

Qwen2.5's format (its template's `tools` variable and system text): a call is
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. Free text before the marker is not
constrained (all tokens but control tokens allowed); from the marker on (or from a `{` opening the
answer), the JSON must be one of the tools' calls with arguments valid for its parameter schema,
and the answer ends after the call with finish_reason tool_calls. The node never runs a tool: a
client does, and returns the result (a `tool` turn) to continue the conversation.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

import yaml

from .constraint import JSON_OPTIONS

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_TOOLS = 64


class ToolsFileError(ValueError):
    """The tools file is unreadable or declares a tool wrongly; the message names the tool."""


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments_json: str


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict            # a JSON Schema for the arguments object


def read_tools_file(path: str) -> tuple:
    """YAML `tools: [{name, description, parameters}]` -> (Tool, ...); "" -> ()."""
    if not path:
        return ()
    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as error:
        raise ToolsFileError(f"tools file {path!r}: {error}") from error
    entries = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ToolsFileError(f"tools file {path!r} needs a non-empty list under `tools:`")
    return tools_from_entries(entries, path)


def tools_from_entries(entries: list, where: str = "tools") -> tuple:
    if len(entries) > MAX_TOOLS:
        raise ToolsFileError(f"{where}: {len(entries)} tools, at most {MAX_TOOLS}")
    tools, names = [], set()
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise ToolsFileError(f"{where}: tool {index} needs a name of letters, digits and _ (got {name!r})")
        if name in names:
            raise ToolsFileError(f"{where}: tool {name!r} is declared twice")
        parameters = entry.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict) or parameters.get("type") != "object":
            raise ToolsFileError(f"{where}: tool {name!r}: parameters must be a JSON Schema of type object")
        names.add(name)
        tools.append(Tool(name, str(entry.get("description", "")), parameters))
    return tuple(tools)


class ToolCatalog:
    def __init__(self, tools: tuple):
        self.tools = tools

    def __bool__(self) -> bool:
        return bool(self.tools)

    def template_tools(self) -> list:
        """The `tools` variable of a chat template (the OpenAI function format Qwen2.5 expects)."""
        return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.parameters}} for t in self.tools]

    def call_schema(self) -> dict:
        """One call: {"name": <a tool>, "arguments": <its parameters>}, name first as the template shows."""
        calls = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                  "required": ["name", "arguments"], "additionalProperties": False} for t in self.tools]
        return {"anyOf": calls, "x-guidance": JSON_OPTIONS}

    def lark_grammar(self) -> str:
        """Free text; or free text, the marker and exactly one call; or an answer that is a bare call.

        `[lazy]` ends the free text at the first marker, so the constraint only starts there. The
        bare form is there because Qwen2.5-Coder-0.5B, at temperature 0, answers "Shut off valve
        three." with the call's JSON and no marker: an answer that starts with `{` is a call."""
        schema = json.dumps(self.call_schema())
        return (f'start: FREE | opened "\\n" call "\\n{CALL_CLOSE}" | call\n'
                f'call: %json {schema}\n'
                f'opened[lazy]: FREE "{CALL_OPEN}"\n'
                'FREE: /([^{](.|\\n)*)?/\n')

    @staticmethod
    def parse_call(text: str, call_id: str) -> Optional[ToolCall]:
        """The call that ends an answer the tools grammar completed (with or without its markers)."""
        start, end = text.rfind(CALL_OPEN), text.rfind(CALL_CLOSE)
        body = text[start + len(CALL_OPEN):end] if 0 <= start < end else text
        try:
            call = json.loads(body)
        except ValueError:
            return None
        if not isinstance(call, dict) or "name" not in call or "arguments" not in call:
            return None
        return ToolCall(call_id, call["name"], json.dumps(call["arguments"]))
