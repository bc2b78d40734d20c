"""Guided decoding: outputs constrained to a JSON schema, a regex, a choice or a grammar.

``params`` (plain data, no xgrammar) is what users and the engine pass around; ``grammar``,
``cache`` and ``manager`` use xgrammar and are imported only where constraints are built.
"""

from octavo.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
