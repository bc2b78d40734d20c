"""The bounded chat-template sandbox: template bombs stop at a named limit, quickly and
without the memory they ask for; ordinary templates render exactly as transformers'
``apply_chat_template`` renders them; the server's own template is checked at start."""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import jinja2
import pytest

from octavo.entrypoints.openai.chat_template import (
    ChatRender,
    ChatTemplateError,
    check_start_template,
    render,
)
from octavo.entrypoints.openai.template_sandbox import TemplateLimitError, render_template
from tests.core.tiny_models import tiny_tokenizer

BIG = "{% set s = 'x' * 1000000 %}"
BOMBS = {
    "repeat": "{{ 'x' * 10**10 }}",
    "nested ranges": "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}"
                     "{% endfor %}",
    "namespace doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                          "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "plus doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                     "{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "top-level doubling": "{% set s0 = 'x' * 64 %}" + "".join(
        f"{{% set s{i + 1} = s{i} ~ s{i} %}}" for i in range(40)),
    "center filter": "{{ 'x' | center(10**10) }}",
    "center method": "{{ 'x'.center(10**10) }}",
    "replace method": BIG + "{{ s.replace('', s) }}",
    "replace filter": BIG + "{{ s | replace('', s) }}",
    "percent width": "{{ '%0999999999d' % 1 }}",
    "format width": "{{ '{:>999999999}'.format(1) }}",
    "join filter": BIG + "{{ ([s] * 1000) | join }}",
    "join method": BIG + "{{ ''.join([s] * 1000) }}",
    "indent": "{% set s = '\n' * 1000000 %}{{ s | indent(1000) }}",
    "output": BIG + "{% for i in range(99999) %}{{ s }}{% endfor %}",
    "block set": BIG + "{% set b %}{% for i in range(99999) %}{{ s }}{% endfor %}{% endset %}",
    "literal in loops": "{% for i in range(99999) %}{% for j in range(99999) %}" + "A" * 1000
                        + "{% endfor %}{% endfor %}",
    "list repeat": "{{ ([1] * 10**9) | length }}",
    "power": "{{ (10 ** 99) ** 99 ** 99 }}",
}
MAX_SECONDS = 1.0  # the render's own limit is 0.5 s
MAX_TRACED_BYTES = 64 << 20  # the largest value allowed is 8 Mi characters


@pytest.mark.timed
@pytest.mark.parametrize("template", BOMBS.values(), ids=BOMBS)
def test_template_bombs_stop_at_a_named_limit(template: str) -> None:
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(TemplateLimitError, match="limit of"):
            render_template(template, {"messages": []})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.monotonic() - start < MAX_SECONDS
    assert peak < MAX_TRACED_BYTES, f"{peak / 2**20:.0f} MiB"


TEMPLATES = {
    "roles": "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"
             "{% if add_generation_prompt %}<|assistant|>{% endif %}",
    "features": (
        "{%- set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ loop.index }}:{{ m.role | upper }} {{ m.content | trim | indent(2) }}"
        "{% if m.thinking is defined %}[{{ m.thinking }}|{{ m.reasoning_content }}]{% endif %}"
        "{% if not loop.last %}\n{% endif %}{% endfor %}{{ ns.n }}"
        "{{ tools | tojson(indent=2) }}{{ '%s-%d' % ('a', 3) }}{{ '{}!'.format(bos_token) }}"
        "{{ ', '.join(['x', 'y']) ~ (['p'] * 2) | join('+') }}{{ 'ab' * 3 }}{{ 2 ** 10 }}"
        "{% for k, v in dict(a=1, b=2).items() %}{{ k }}={{ v }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"),
}
CONVERSATION = [{"role": "system", "content": "  Be brief.\nAlways.  "},
                {"role": "user", "content": "Hi <|eos|>", "name": None},
                {"role": "assistant", "content": "Hello", "reasoning_content": "greet"},
                {"role": "user", "content": "And 2+2?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("template", TEMPLATES.values(), ids=TEMPLATES)
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_templates_render_as_transformers_renders_them(template: str,
                                                       generation_prompt: bool) -> None:
    tokenizer = tiny_tokenizer()
    ours = render(tokenizer, template, [dict(m) for m in CONVERSATION],
                  ChatRender(tools=TOOLS, add_generation_prompt=generation_prompt))
    theirs = tokenizer.apply_chat_template([dict(m) for m in CONVERSATION],
                                           chat_template=template, tools=TOOLS,
                                           add_generation_prompt=generation_prompt,
                                           tokenize=False)
    assert ours == theirs


def test_continue_final_message_cuts_as_transformers_does() -> None:
    tokenizer = tiny_tokenizer()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hi"},
                                      {"role": "assistant", "content": "Sure,"}]
    template = TEMPLATES["roles"]
    ours = render(tokenizer, template, [dict(m) for m in messages],
                  ChatRender(add_generation_prompt=False, continue_final_message=True))
    theirs = tokenizer.apply_chat_template([dict(m) for m in messages], chat_template=template,
                                           continue_final_message=True, tokenize=False)
    assert ours == theirs and ours.endswith("<|assistant|>Sure,")


@pytest.mark.parametrize(("template", "message"), [
    ("{{ 'x' * 10**10 }}", "cannot be used: the chat template made a string"),
    ("{% for m in messages %}\n{% for %}", "cannot be parsed: .* \\(line 2\\)"),
])
def test_the_servers_template_is_refused_at_start_in_one_line(template: str,
                                                               message: str) -> None:
    with pytest.raises(ChatTemplateError, match=message) as refused:
        check_start_template(tiny_tokenizer(), template)
    assert "\n" not in str(refused.value)


def test_a_template_that_raises_for_some_conversations_starts() -> None:
    check_start_template(tiny_tokenizer(), "{% if messages[0].role != 'system' %}"
                                           "{{ raise_exception('system first') }}{% endif %}")


@pytest.mark.parametrize("template", ["{% set ns = namespace(_x=1) %}",
                                      "{% set ns = namespace() %}{% set ns._x = 1 %}",
                                      "{{ ''.__class__.__mro__ }}"])
def test_the_sandbox_still_refuses_underscore_attributes(template: str) -> None:
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_template(template, {})
