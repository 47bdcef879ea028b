"""ChatTemplate: SmolLM2's own template, the ChatML fallback, sandboxing and bad input."""
from __future__ import annotations

import pytest

from edge_slm_node.model.chat_template import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError

SYSTEM = "You are a CNC assistant. Answer in G-code."
USER = "Face the stock to Z0 at 12000 rpm."


def test_smollm2_system_and_user(smollm2_metadata):
    template = ChatTemplate.from_metadata(smollm2_metadata)
    assert not template.uses_fallback
    assert (template.bos_token, template.eos_token) == ("<|im_start|>", "<|im_end|>")
    text = template.render([{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}])
    assert text == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{USER}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_smollm2_default_system_prompt_without_generation_prompt(smollm2_metadata):
    template = ChatTemplate.from_metadata(smollm2_metadata)
    text = template.render([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
    )


def test_rendered_prompt_equals_llama_cpp_python_rendering(smollm2_metadata, llama_cpp_greedy):
    """The fixture's chat prompts were rendered by llama-cpp-python's Jinja2ChatFormatter."""
    template = ChatTemplate.from_metadata(smollm2_metadata)
    chat_cases = [case for case in llama_cpp_greedy["cases"] if case["kind"] == "chat"]
    assert len(chat_cases) >= 2
    for case in chat_cases:
        assert template.render(case["messages"], add_generation_prompt=True) == case["prompt_text"]


def test_chat_prompt_tokenizes_with_special_tokens(smollm2_metadata, smollm2_tokenizer):
    text = ChatTemplate.from_metadata(smollm2_metadata).render([{"role": "user", "content": USER}])
    ids = smollm2_tokenizer.encode(text)
    assert ids[0] == 1  # <|im_start|>
    assert ids.count(1) == 3 and ids.count(2) == 2  # system, user, assistant / two <|im_end|>
    assert ids[-3:] == smollm2_tokenizer.encode("<|im_start|>assistant\n")[-3:]


def test_fallback_is_plain_chatml_when_the_gguf_has_none(smollm2_metadata):
    metadata = {key: value for key, value in smollm2_metadata.items() if key != "tokenizer.chat_template"}
    template = ChatTemplate.from_metadata(metadata)
    assert template.uses_fallback and template.source == CHATML_TEMPLATE
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER},
                {"role": "assistant", "content": "G0 Z0"}, {"role": "user", "content": "again"}]
    assert template.render(messages) == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{USER}<|im_end|>\n"
        "<|im_start|>assistant\nG0 Z0<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ChatTemplate("").render([{"role": "user", "content": "x"}], add_generation_prompt=False) == \
        "<|im_start|>user\nx<|im_end|>\n"


def test_template_variables_and_helpers():
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{{ m.role | upper }}:{{ m.content | tojson }}\n"
        "{% endfor %}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}{{ extra_var }}",
        bos_token="<s>", eos_token="</s>",
    )
    text = template.render([{"role": "user", "content": "主轴 \"on\""}], extra_var="!")
    assert text == '<s>USER:"主轴 \\"on\\""\n></s>!'


def test_generation_block_renders_its_body():
    template = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
        "{% endgeneration %}{% else %}[{{ m.content }}]{% endif %}{% endfor %}"
    )
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert template.render(messages) == "[q]a"


def test_raise_exception_becomes_chat_template_error():
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}ok"
    )
    assert template.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="first message must be user"):
        template.render([{"role": "assistant", "content": "x"}])


@pytest.mark.parametrize("source", [
    "{{ messages.__class__.__mro__ }}",
    "{{ messages.append(1) }}",
    "{{ ''.__class__.__subclasses__() }}",
])
def test_sandbox_blocks_unsafe_access(source):
    with pytest.raises(ChatTemplateError, match="unsafe|SecurityError"):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("messages, message", [
    ("hello", "list of dicts"),
    ([["user", "hi"]], "message 0 must be a dict"),
    ([{"role": "user"}], "message 0 needs a str 'content'"),
    ([{"role": "user", "content": "a"}, {"role": 3, "content": "b"}], "message 1 needs a str 'role'"),
])
def test_bad_messages_are_rejected(messages, message):
    with pytest.raises(ChatTemplateError, match=message):
        ChatTemplate(None).render(messages)


def test_syntax_error_is_reported():
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for m in messages %}")
    assert issubclass(ChatTemplateError, ValueError)
