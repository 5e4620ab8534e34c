"""Chat templates render with a budget of work and size (issue 35, data/template_sandbox.py): every way a
template can loop for ever or build a huge value is stopped within seconds and bounded memory, and real-shaped
templates render exactly as Jinja's own sandbox renders them."""

from __future__ import annotations

import time

import jinja2.ext
import pytest
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from finetune.data.chat_template import CHATML_TEMPLATE
from finetune.data.template_sandbox import BoundedSandbox, TemplateLimitError, install

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]


def _env(cls):
    return cls(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])


def _render(template: str, cls=BoundedSandbox, **values) -> str:
    return _env(cls).from_string(template).render(messages=CHAT, **values)


# Each ran until killed or filled memory under Jinja's sandbox alone (the first two are the issue's).
HOSTILE = {
    "nested range loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested loops over one range": "{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
    "nested loops over a list": "{% set r = range(100000)|list %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
    "string doubling in a namespace": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling with +": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "doubling in a macro": "{% macro d(s, n) %}{{ d(s ~ s, n - 1) if n else s|length }}{% endmacro %}{{ d('ab', 60) }}",
    "doubling in a set block": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set t %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = t %}{% endfor %}",
    "doubling without a loop": "{% set a = 'abcdefgh' * 1000 %}" + "".join("{% set a = a ~ a %}" for _ in range(40)),
    "a repeated string": "{{ ('a' * 1000000000)|length }}",
    "a huge power": "{{ (2 ** 100000000) > 1 }}",
    "a squared integer in a loop": "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "a printf width": "{{ ('%999999999s' % 'a')|length }}",
    "a format width": "{{ '{:>999999999}'.format('a')|length }}",
    "a centred string": "{{ 'a'|center(999999999)|length }}",
    "a padded string": "{{ 'a'.ljust(999999999)|length }}",
    "a growing replace": "{% set s = 'a' * 100000 %}{{ s.replace('a', s)|length }}",
    "a growing replace filter": "{% set s = 'a' * 100000 %}{{ s|replace('a', s)|length }}",
    "a join with a huge separator": "{% set s = 'a' * 500000 %}{{ s.join(range(100000)|map('string'))|length }}",
    "nested list literals printed": "{% set a = 'a' * 100000 %}{% set b = [a, a, a, a, a, a, a, a, a, a] %}{% set c = [b, b, b, b, b, b, b, b, b, b] %}{% set d = [c, c, c, c, c, c, c, c, c, c] %}{{ d }}",
    "a repeated list printed": "{% set a = 'a' * 100000 %}{{ ([a] * 100000)|length }}",
    "branching recursion": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "a recursive loop": "{% for x in range(100000) recursive %}{{ loop(range(100000)) if x == 0 }}{% endfor %}",
    "an indent of many lines": "{% set s = '\\n' * 100000 %}{{ s|indent(100000)|length }}",
    "tabs expanded": "{% set s = '\\t' * 100000 %}{{ s.expandtabs(100000)|length }}",
    "a huge output": "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
    "lorem ipsum": "{{ lipsum(100000, false, 1000, 1000)|length }}",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_template_is_stopped_in_seconds(name):
    started = time.monotonic()
    with pytest.raises((TemplateLimitError, SecurityError, OverflowError, RecursionError)):
        _render(HOSTILE[name])
    assert time.monotonic() - started < 60  # each takes well under 2 s (measured 0.0-1.3 s); generous, not a benchmark


REAL = {
    "chatml with tools": CHATML_TEMPLATE,
    "a namespace and reversed loop": (
        "{%- set ns = namespace(last=-1) %}{%- for m in messages[::-1] %}{%- if ns.last < 0 and m.role == 'user' %}"
        "{%- set ns.last = (messages|length - 1) - loop.index0 %}{%- endif %}{%- endfor %}"
        "{%- for m in messages %}{{ '<|' ~ m.role ~ '|>' + m.content|trim ~ ('*' if loop.index0 == ns.last else '') }}"
        "{%- if not loop.last %}{{ '\\n' }}{% endif %}{%- endfor %}"
        "{%- if tools %}{{ tools|tojson(indent=2) }}{{ tools|map(attribute='function')|map(attribute='name')|join(', ') }}{% endif %}"
    ),
    "formats and filters": (
        "{{ bos }}{% for m in messages %}{{ '%s: %s' % (m.role|upper, m.content) }}{{ '{}/{}'.format(loop.index, "
        "loop.length) }}{{ m.content|center(12)|replace(' ', '.') }}{{ m.content|indent(2, true) }}{% endfor %}"
        "{% for t in tools or [] %}{{ t.function.name.ljust(4) }}{% endfor %}{{ range(3)|list|join(',') }}"
    ),
    "alternation check": (
        "{%- for m in messages[1:] %}{%- if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
        "{{- raise_exception('roles must alternate') }}{%- endif %}{{ ' [INST] ' ~ m.content if m.role == 'user' "
        "else ' ' ~ m.content ~ '</s>' }}{%- endfor %}"
    ),
}


def _plain(template: str, **values) -> str:
    return _render(template, ImmutableSandboxedEnvironment, **values)


@pytest.mark.parametrize("name", REAL)
def test_a_real_shaped_template_renders_exactly_as_before(name):
    for values in ({"tools": TOOLS, "bos": "<s>"}, {"tools": None, "bos": ""}):
        assert _render(REAL[name], **values) == _plain(REAL[name], **values)


def test_a_long_conversation_is_not_refused():
    """The budget grows with what is rendered: 4,000 messages of 2,000 characters (8 MB) render whole."""
    messages = [{"role": ("user", "assistant")[i % 2], "content": f"{i} " + "x" * 2000} for i in range(4000)]
    env = _env(BoundedSandbox)
    text = env.from_string(CHATML_TEMPLATE).render(messages=messages, tools=TOOLS)
    assert text == _env(ImmutableSandboxedEnvironment).from_string(CHATML_TEMPLATE).render(
        messages=messages, tools=TOOLS
    )


def test_the_budget_is_per_render_not_per_template():
    template = _env(BoundedSandbox).from_string("{% for i in range(100000) %}{% endfor %}{{ messages|length }}")
    assert all(template.render(messages=CHAT) == "3" for _ in range(60))  # 6 million steps in all, 100,000 each


def test_transformers_compiles_chat_templates_with_the_bounded_class(toy_model):
    from transformers import AutoTokenizer

    install()
    tokenizer = AutoTokenizer.from_pretrained(toy_model)
    tokenizer.chat_template = HOSTILE["nested range loops"]
    with pytest.raises(TemplateLimitError):
        tokenizer.apply_chat_template(CHAT, tokenize=False)
