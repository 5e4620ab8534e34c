"""Chat templates rendered with bounded work and bounded size (issue 35).

Jinja's `ImmutableSandboxedEnvironment` (what transformers renders chat templates with) stops a template from
running code, but not from running for ever or filling memory: two nested `range(100000)` loops ran until killed,
and a string doubled in a loop took `validate` to 19.5 GB. `BoundedSandbox` is that environment with a budget per
render, reset for every conversation:

- work: every loop iteration, filter and intercepted operator is one step, a call 25 (at most `steps` per render);
- size: every value a template builds through an operator (`*`, `+`, `%`, `**`, `~`), a call or a filter, every
  value it outputs, and the whole output are measured (characters, list items, deep) and must stay under
  `chars` per render; where an operation could build far more than it is given (`'a' * n`, `replace`, `join`,
  `center`, `indent`, format widths, big integers), the size is predicted and refused before it is built.

The budget grows with the conversation (`budget_for`), so a long record renders as before. `install()` makes
transformers compile every chat template with this class: its globals, filters and extensions stay its own, so a
template renders exactly as before, and a template that goes over is refused with `TemplateLimitError`.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.environment import Environment, Template
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context, LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

BASE_STEPS = 2_000_000  # ~1 s of Jinja work; a real template takes tens of steps per message
STEPS_PER_ITEM = 1_000  # more for each message and tool in the conversation
CALL_STEPS = 25  # a call (a macro's above all) costs about as much as 25 loop iterations
BASE_CHARS = 1_000_000  # the rendered text and any value built on the way
CHARS_FACTOR = 8  # ... plus this many times the conversation's own size
MAX_INT_BITS = 4_096  # integers a template computes (10 ** 1233): enough for any arithmetic a template does

_FORMAT_WIDTH = re.compile(r"%[#0\- +]*(\d+)(?:\.(\d+))?|\{[^{}]*?:[^{}]*?(\d+)(?:\.(\d+))?[^{}]*\}")
_STRFTIME_WIDTH = re.compile(r"%[-_0^#]*(\d+)")
_WIDTH_METHODS = {"center", "ljust", "rjust", "zfill"}


class TemplateLimitError(SecurityError):
    """A chat template went over its budget of work or size for one conversation."""


@dataclass
class Budget:
    steps: int
    chars: int
    sizes: dict[int, tuple[Any, int]] = field(default_factory=dict)  # id -> (object kept alive, deep size)

    def step(self, count: int = 1) -> None:
        self.steps -= count
        if self.steps < 0:
            raise TemplateLimitError("it ran too long (loop iterations and calls past the limit for one conversation)")

    def allow(self, size: int, what: str = "a value") -> None:
        if size > self.chars:
            raise TemplateLimitError(f"it built {what} of over {self.chars:,} characters")


_BUDGET: ContextVar[Budget | None] = ContextVar("chat_template_budget", default=None)


def budget_for(values: dict) -> Budget:
    """The budget for rendering with `values` (messages, tools, ...): generous, and growing with their size."""
    items = len(values.get("messages") or ()) + len(values.get("tools") or ())
    size = len(repr(values))  # the caller's plain data (not the template's): printed at C speed
    return Budget(steps=BASE_STEPS + STEPS_PER_ITEM * items, chars=BASE_CHARS + CHARS_FACTOR * size)


def _current() -> Budget:
    budget = _BUDGET.get()
    # outside a render (Jinja folding constants while it compiles): a fresh budget for this one operation
    return budget if budget is not None else budget_for({})


def deep_size(value: Any, budget: Budget, _seen: frozenset[int] = frozenset()) -> int:
    """Characters and items in `value`, containers counted deep (what `str(value)` would at least print); stops
    counting once over the budget's size. Containers are memoised for the render (a template's data is immutable)."""
    kind = type(value)
    if kind is str or kind is bytes or isinstance(value, (str, bytes)):
        return len(value)
    if kind is int:
        return value.bit_length() // 3 + 1
    if kind is range:
        return len(value)
    if isinstance(value, Namespace):  # mutable: never memoised
        return deep_size(object.__getattribute__(value, "_Namespace__attrs"), budget, _seen | {id(value)})
    if kind is not list and kind is not tuple and kind is not dict or id(value) in _seen:
        return 1  # numbers, None, Undefined, generators, the template's own objects; and a cycle
    known = budget.sizes.get(id(value))
    if known is not None and known[0] is value:
        return known[1]
    seen = _seen | {id(value)}
    total = len(value)
    for item in value.values() if kind is dict else value:
        total += deep_size(item, budget, seen)
        if total > budget.chars:
            return total
    if kind is dict:
        total += sum(deep_size(key, budget, seen) for key in value)
    budget.sizes[id(value)] = (value, total)
    return total


def _check(value: Any, what: str = "a value") -> Any:
    budget = _BUDGET.get() or budget_for({})
    size = len(value) if type(value) is str else deep_size(value, budget)
    if size > budget.chars:
        budget.allow(size, what)
    return value


def _check_widths(fmt: str, pattern: re.Pattern = _FORMAT_WIDTH) -> None:
    budget = _current()
    for match in pattern.finditer(fmt):
        for number in match.groups():
            if number is not None:
                budget.allow(int(number), "a formatted field")


def _ints_allowed(values) -> None:
    budget = _current()
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            budget.allow(abs(value), "a value")


def _predict_join(separator: str, items) -> list:
    """`items` as a list, once the join of them with `separator` is known to fit."""
    budget = _current()
    listed = []
    for item in items:
        budget.step()
        listed.append(item)
    budget.allow(len(separator) * len(listed) + deep_size(listed, budget), "a joined text")
    return listed


def _predict_replace(text: str, old: str, new: str) -> None:
    budget = _current()
    budget.allow(len(text) + text.count(old) * max(len(new) - len(old), 0) if old else len(text) * (len(new) + 1))


def _predict_method(method, args: tuple) -> tuple:
    """Refuse a str method call whose result would be over the budget before it is made; the args to call with."""
    text, name = method.__self__, method.__name__
    if name in _WIDTH_METHODS and args and isinstance(args[0], int):
        _current().allow(args[0], "a padded text")
    elif name == "expandtabs":
        _current().allow(len(text) + text.count("\t") * (args[0] if args and isinstance(args[0], int) else 8))
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        _predict_replace(text, args[0], args[1])
    elif name == "join" and args:
        return (_predict_join(text, args[0]), *args[1:])
    elif name in {"format", "format_map"}:
        _check_widths(text)
        _current().allow(len(text) + deep_size(args, _current()), "a formatted text")
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((deep_size(v, _current()) for v in args[0].values()), default=1)
        _current().allow(len(text) * max(longest, 1), "a translated text")
    return args


def _predict_filter(name: str, args: tuple, kwargs: dict) -> tuple:
    """The filters that can build far more than they are given: refuse before they do; the args to call with."""
    budget = _current()
    value = args[0] if args else None
    if name == "indent" and isinstance(value, str):
        width = args[1] if len(args) > 1 else kwargs.get("width", 4)
        width = len(width) if isinstance(width, str) else width if isinstance(width, int) else 4
        budget.allow(len(value) + (value.count("\n") + 1) * width, "an indented text")
    elif name == "replace" and len(args) >= 3 and isinstance(value, str):
        _predict_replace(value, str(args[1]), str(args[2]))
    elif name == "join" and value is not None:
        separator = args[1] if len(args) > 1 else kwargs.get("d", "")
        return (_predict_join(str(separator), value), *args[1:])
    elif name == "format" and isinstance(value, str):
        _check_widths(value)
    elif name == "tojson":
        indent = args[1] if len(args) > 1 else kwargs.get("indent")
        factor = 1 + (len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0)
        budget.allow(deep_size(value, budget) * factor, "a JSON text")
    return args


def _bounded_filter(name: str, function):
    if getattr(function, "_bounded", False):
        return function

    @wraps(function)  # keeps jinja_pass_arg, so Jinja still passes the context or environment it asks for
    def bounded(*args, **kwargs):
        budget = _current()
        budget.step()
        plain = [a for a in args if not _is_jinja_object(a)]
        _ints_allowed([*plain[1:], *kwargs.values()])  # the filter's parameters, not the value it filters
        budget.allow(sum(deep_size(a, budget) for a in [*plain, *kwargs.values()]), "a value")
        offset = len(args) - len(plain)
        args = (*args[:offset], *_predict_filter(name, tuple(args[offset:]), kwargs))
        return _check(function(*args, **kwargs), f"a value (filter {name!r})")

    bounded._bounded = True
    return bounded


def _is_jinja_object(value: Any) -> bool:
    return isinstance(value, (Context, nodes.EvalContext, Environment))


class _BoundedFilters(dict):
    """Filters wrapped as they are added (transformers adds its own tojson after the environment is made)."""

    def __setitem__(self, name: str, function) -> None:
        super().__setitem__(name, _bounded_filter(name, function))


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator with every `for` loop's items counted and every `~` measured before it joins."""

    def visit_For(self, node: nodes.For, frame) -> None:
        if not getattr(node, "_bounded", False):
            counted = nodes.Call(nodes.EnvironmentAttribute("counted"), [node.iter], [], None, None)
            node.iter = counted.set_lineno(node.iter.lineno)
            node._bounded = True
        super().visit_For(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame) -> None:
        if frame.eval_ctx.volatile:
            function = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            function = "markup_join"
        else:
            function = "str_join"
        self.write(f"{function}(environment.measured((")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write(")))")


class BoundedTemplate(Template):
    """A template whose every render has a fresh budget sized to what it is given."""

    def render(self, *args, **kwargs) -> str:
        token = _BUDGET.set(budget_for(dict(*args, **kwargs)))
        try:
            return super().render(*args, **kwargs)
        finally:
            _BUDGET.reset(token)

    def generate(self, *args, **kwargs):
        token = _BUDGET.set(budget_for(dict(*args, **kwargs)))
        try:
            yield from super().generate(*args, **kwargs)
        finally:
            _BUDGET.reset(token)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """`ImmutableSandboxedEnvironment` with a budget of work and size per render (see the module's docstring)."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "%", "+"})
    template_class = BoundedTemplate

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.filters = _BoundedFilters({name: _bounded_filter(name, f) for name, f in self.filters.items()})
        self.finalize = _check  # every value output is measured first

    def counted(self, iterable):
        budget = _current()
        for item in iterable:
            budget.step()
            yield item

    def measured(self, parts: tuple) -> tuple:
        budget = _current()
        budget.allow(sum(deep_size(part, budget) for part in parts), "a text")
        return parts

    def concat(self, parts) -> str:  # the whole output, and every macro's and block's
        budget, total, kept = _current(), 0, []
        for part in parts:
            total += len(part)
            budget.allow(total, "an output")
            kept.append(part)
        return "".join(kept)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        budget = _current()
        budget.step()
        numbers = isinstance(left, int) and isinstance(right, int)
        if operator == "**" and numbers and abs(left) > 1 and right > 0:
            if right * left.bit_length() > MAX_INT_BITS:
                raise TemplateLimitError(f"it computed a number too large ({left} ** {right})")
        elif operator == "*" and numbers:
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateLimitError("it computed a number too large")
        elif operator == "*":
            sequence, times = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(times, int):
                budget.allow(deep_size(sequence, budget) * max(times, 0), "a repeated value")
        elif operator == "%" and isinstance(left, str):
            _check_widths(left)
            _ints_allowed(right if isinstance(right, tuple) else [right])
            budget.allow(len(left) + deep_size(right, budget), "a formatted text")
        elif operator == "+" and not numbers:
            budget.allow(deep_size(left, budget) + deep_size(right, budget), "a value")
        return _check(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's own signature)
        budget = _current()
        budget.step(CALL_STEPS)
        _ints_allowed([*args, *kwargs.values()])  # what a call is given exists already: only what it builds counts
        method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format, keeping it as __wrapped__
        if isinstance(getattr(method, "__self__", None), str):
            args = _predict_method(method, args)
        elif isinstance(__obj, LoopContext) and args:  # a recursive loop's next level: its items count too
            args = (__self.counted(args[0]), *args[1:])
        elif getattr(__obj, "__name__", "") == "generate_lorem_ipsum":
            n = args[0] if args else kwargs.get("n", 5)
            maximum = args[3] if len(args) > 3 else kwargs.get("max", 100)
            budget.allow(n * maximum * 12 if isinstance(n, int) and isinstance(maximum, int) else 0, "a text")
        elif getattr(__obj, "__name__", "") == "strftime_now" and args and isinstance(args[0], str):
            _check_widths(args[0], _STRFTIME_WIDTH)
        return _check(super().call(__context, __obj, *args, **kwargs))


def install() -> None:
    """Make transformers compile every chat template with `BoundedSandbox` (idempotent). Its compile function
    builds the environment from this module-level name, then adds its own globals, filters and extensions."""
    from transformers.utils import chat_template_utils as utils

    if utils.ImmutableSandboxedEnvironment is BoundedSandbox:
        return
    if not hasattr(utils, "_compile_jinja_template"):  # a transformers that compiles elsewhere: fail loudly
        raise RuntimeError("transformers no longer compiles chat templates in chat_template_utils; update install()")
    utils.ImmutableSandboxedEnvironment = BoundedSandbox
    utils._compile_jinja_template.cache_clear()  # templates compiled before, with the unbounded class
