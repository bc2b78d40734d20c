"""Pythonic tool calls (Llama 3.2 and 4's ``tool_chat_template_*_pythonic.jinja``): the
whole reply is a Python list of calls with keyword arguments,
``[get_weather(city="Paris", unit="celsius"), get_time()]``.

Its arguments are Python literals, not JSON, so no JSON schema can constrain them:
``--enable-auto-tool-choice`` leaves them free with this parser. A call is complete only
once the whole list parses, so streams get each call whole (name first, then its arguments
in one piece) when the list closes.
"""

from __future__ import annotations

import ast
import json

from octavo.entrypoints.openai.tool_parsers.base import CallText, Parsed, ToolParser
from octavo.entrypoints.openai.tool_parsers.json_scan import NotJSON


class PythonicToolParser(ToolParser):
    start = ("[",)

    def parse(self, text: str, final: bool) -> Parsed:
        """Calls only when the reply (less leading whitespace) is the list."""
        stripped = text.lstrip()
        if not stripped:
            return Parsed(text if final else "")
        if not stripped.startswith("["):
            return Parsed(text)
        try:
            calls = self.read_calls(stripped, 0)
        except NotJSON:
            return Parsed(text)
        if calls[0].done or not final:
            return Parsed("", calls)
        return Parsed(text)

    def read_calls(self, text: str, start: int) -> list[CallText]:
        try:
            tree = ast.parse(text[start:].strip(), mode="eval").body
        except SyntaxError:
            return [CallText(None)]  # unfinished (or not a list of calls: seen at the end)
        except (RecursionError, MemoryError, ValueError):  # nested past the parser's limits
            raise NotJSON("not a list of calls") from None
        if not isinstance(tree, ast.List) or not tree.elts:
            raise NotJSON("not a list of calls")
        return [_call(node) for node in tree.elts]


def _call(node: ast.expr) -> CallText:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        raise NotJSON("not a call with keyword arguments")
    try:
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords
                     if kw.arg is not None}
        text = json.dumps(arguments, ensure_ascii=False)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        raise NotJSON("arguments that are not literals") from None
    return CallText(node.func.id, text, True)
