"""``render_template``: a chat template rendered in a sandbox that also bounds what the
template may cost - the length of every string or list it makes (and of its output), the
steps it takes (loop iterations, calls, operators) and the time.

Jinja's ``ImmutableSandboxedEnvironment`` keeps a template from reaching Python's internals
but not from exhausting the process: ``{{ 'x' * 10**10 }}`` allocates 10 GB in one C call,
and loops nested over ``range(99999)`` that print nothing hold a thread for hours. Here every
operation that can make a long value is checked before it runs (repetition, concatenation,
``%`` and ``format`` widths, the width and joining filters and methods), every value a call
or filter returns is measured, every loop iteration and call counts a step and looks at the
clock, and the output is counted as it is written. A template over a limit stops within a
step of it with ``TemplateLimitError``, naming the limit; so no render holds its thread for
longer than ``max_seconds`` plus one bounded step.

The environment is transformers' chat-template one (``trim_blocks``, ``lstrip_blocks``,
``loopcontrols``, HF's ``{% generation %}`` tag, ``tojson`` without HTML escaping,
``raise_exception``, ``strftime_now``, ``namespace``), so templates render as they do there.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.parser
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.ext import Extension
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

MAX_INT_BITS = 4096  # integers a template computes (10**10 ** 10 would take minutes)
# Methods of str whose integer arguments are a width of the result.
WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class TemplateLimits:
    """What one render may cost."""

    max_chars: int = 8 << 20  # any string or list it makes, and its output
    max_steps: int = 2_000_000  # loop iterations, calls and operators
    max_seconds: float = 0.5


class TemplateLimitError(jinja2.exceptions.SecurityError):
    """A render went past one of its ``TemplateLimits``; the message names which."""


class _Budget:
    """One render's steps and deadline."""

    def __init__(self, limits: TemplateLimits) -> None:
        self.limits = limits
        self.steps = 0
        self.deadline = time.monotonic() + limits.max_seconds

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.limits.max_steps:
            raise TemplateLimitError(f"the chat template took more than its limit of "
                                     f"{self.limits.max_steps:,} steps (loop iterations, "
                                     "calls and operators)")
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"the chat template took longer than its limit of "
                                     f"{self.limits.max_seconds:g} s to render")

    def check_size(self, size: int) -> None:
        if size > self.limits.max_chars:
            raise TemplateLimitError(f"the chat template made a string, list or output of "
                                     f"{size:,} items, over its limit of "
                                     f"{self.limits.max_chars:,}")


_BUDGET: ContextVar[_Budget | None] = ContextVar("template_budget", default=None)


def _budget() -> _Budget:
    """The current render's budget; outside ``render_template`` a fresh one per operation
    (sizes are still checked, steps and time are render_template's to count)."""
    return _BUDGET.get() or _Budget(TemplateLimits())


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict) else 0


def _check_widths(budget: _Budget, args: Iterable[Any]) -> None:
    """Integer arguments that would make a result that wide."""
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool):
            budget.check_size(arg)


def _check_format(budget: _Budget, text: str) -> None:
    """The widths and precisions written in a ``%`` or ``format`` string."""
    for digits in _DIGITS.findall(text):
        budget.check_size(int(digits[:20]))


def _replaced_size(text: str, old: str, new: str) -> int:
    if not old:
        return (len(text) + 1) * len(new) + len(text)
    return len(text) + text.count(old) * max(0, len(new) - len(old))


def _joined(budget: _Budget, separator: str, items: Any) -> list[Any]:
    """``items`` as a list, checked to join into a string within the limit."""
    parts = list(items)
    budget.check_size(len(parts))
    budget.check_size(sum(len(str(part)) for part in parts) + len(separator) * len(parts))
    return parts


def _bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (a filter) with its arguments checked before and its result after."""

    @functools.wraps(function)  # keeps jinja's pass_context/pass_environment marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.step()
        values = [a for a in args
                  if not isinstance(a, Context | nodes.EvalContext | jinja2.Environment)]
        _check_widths(budget, [*values[1:], *kwargs.values()])
        if values and isinstance(values[0], str):
            text = values[0]
            if name == "indent":
                width = values[1] if len(values) > 1 else kwargs.get("width", 4)
                width = len(width) if isinstance(width, str) else int(width)
                budget.check_size(len(text) + (text.count("\n") + 1) * width)
            elif name == "replace" and len(values) >= 3:
                budget.check_size(_replaced_size(text, str(values[1]), str(values[2])))
            elif name == "format":
                _check_format(budget, text)
        if name == "join" and values:
            separator = values[1] if len(values) > 1 else kwargs.get("d", "")
            args = (*args[:len(args) - len(values)], _joined(budget, str(separator), values[0]),
                    *values[1:])
        result = function(*args, **kwargs)
        budget.check_size(_size(result))
        return result

    return bounded


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator, with every ``for`` loop's iterable counted item by item and
    every ``~`` concatenation measured (neither goes through a sandbox hook otherwise)."""

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        original = node.iter
        node.iter = nodes.Call(nodes.EnvironmentAttribute("bounded_iter"), [original], [],
                               None, None, lineno=node.lineno)
        try:
            super().visit_For(node, frame)
        finally:
            node.iter = original

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.bounded_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class GenerationBlock(Extension):
    """HF's ``{% generation %}...{% endgeneration %}`` (which marks the assistant's turns for
    training masks): rendered as its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


class _TemplateNamespace(Namespace):
    """transformers' namespace: no underscore attributes, and (here) no value over the limit."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (Namespace's signature)
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        _budget().check_size(_size(value))
        super().__setitem__(name, value)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"chat templates cannot store underscore attributes on a namespace: {name!r}")


class _TemplateDict:
    """``dict(...)`` for templates, without the class's attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """transformers' chat-template environment, with the costs of a render bounded."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True,
                         extensions=["jinja2.ext.loopcontrols", GenerationBlock])
        self.filters["tojson"] = _tojson
        self.filters = {name: _bounded_filter(name, function)
                        for name, function in self.filters.items()}
        self.globals.pop("lipsum", None)  # n paragraphs of filler: nothing a chat needs
        self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                            dict=_TemplateDict(), namespace=_TemplateNamespace)

    def call(__self, __context: Context, __obj: Any, *args: Any,  # noqa: N805 (jinja's)
             **kwargs: Any) -> Any:
        budget = _budget()
        budget.step()
        # The sandbox hands out str.format wrapped (its safe formatter): look through it.
        owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
        if isinstance(owner, str):
            name = getattr(__obj, "__name__", "")
            if name in WIDTH_METHODS:
                _check_widths(budget, [*args, *kwargs.values()])
            elif name == "replace" and len(args) >= 2:
                budget.check_size(_replaced_size(owner, str(args[0]), str(args[1])))
            elif name in ("format", "format_map"):
                _check_format(budget, owner)
            elif name == "join" and args:
                args = (_joined(budget, owner, args[0]), *args[1:])
        result = super().call(__context, __obj, *args, **kwargs)
        budget.check_size(_size(result))
        return result

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.step()
        if operator == "*":
            for sequence, count in ((left, right), (right, left)):
                if _size(sequence) and isinstance(count, int):
                    budget.check_size(_size(sequence) * count)
            if isinstance(left, int) and isinstance(right, int):
                _check_bits(left.bit_length() + right.bit_length())
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            _check_bits(max(left.bit_length(), 1) * max(right, 0))
        elif operator == "+" and _size(left) and _size(right):
            budget.check_size(_size(left) + _size(right))
        elif operator == "%" and isinstance(left, str):
            _check_format(budget, left)
        result = super().call_binop(context, operator, left, right)
        budget.check_size(_size(result))
        return result

    def bounded_iter(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """A loop's items, each one step."""
        budget = _budget()
        for item in iterable:
            budget.step()
            yield item

    def bounded_join(self, parts: Iterable[Any]) -> str:
        """``a ~ b ~ ...``, measured before it is joined."""
        budget = _budget()
        budget.step()
        return "".join(_joined(budget, "", (str(part) for part in parts)))

    def concat(self, parts: Iterable[str]) -> str:  # type: ignore[override]
        """The output (and each ``{% set %}`` block's), counted as it is written."""
        budget = _budget()
        written, size = [], 0
        for part in parts:
            size += len(part)
            budget.check_size(size)
            written.append(part)
        return "".join(written)


def _check_bits(bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise TemplateLimitError(f"the chat template computed an integer of about {bits:,} "
                                 f"bits, over its limit of {MAX_INT_BITS:,}")


_ENVIRONMENT = BoundedSandbox()


@functools.lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled in the bounded sandbox (``TemplateSyntaxError`` if it cannot)."""
    return _ENVIRONMENT.from_string(source)


def render_template(source: str, context: dict[str, Any],
                    limits: TemplateLimits | None = None) -> str:
    """``source`` rendered with ``context`` within ``limits`` (``TemplateLimitError`` past
    them; the template's own errors as Jinja raises them)."""
    template = compile_template(source)
    token = _BUDGET.set(_Budget(limits or TemplateLimits()))
    try:
        return template.render(**context)
    finally:
        _BUDGET.reset(token)
