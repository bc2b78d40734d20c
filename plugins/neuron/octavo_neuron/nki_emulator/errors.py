"""The emulator's one error type, and how it finds the kernel line a violation comes from.

A rule violation is only useful if it points at the kernel code that broke the rule, so the
message names the rule, the tensor (its variable name in the kernel when it has one, and its
shape) and the innermost source line outside this package (``file:line: code``).
"""

from __future__ import annotations

import inspect
import linecache
import os
from types import FrameType
from typing import Any

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class NkiRuleError(Exception):
    """A kernel broke a hardware rule that the real NKI compiler or device would reject.

    ``rule`` is the rule's short name (see the package docstring), ``location`` the kernel's
    ``file:line``."""

    def __init__(self, rule: str, tensor: Any, problem: str,
                 line: tuple[str, int] | None = None) -> None:
        """``line``: the kernel ``(file, line)`` when the violation is found outside the
        kernel's frames (its outputs, checked once it has returned)."""
        frame = _kernel_frame() if line is None else None
        if frame is not None:
            line = (frame.f_code.co_filename, frame.f_lineno)
        self.rule = rule
        self.location = "<unknown>" if line is None else f"{line[0]}:{line[1]}"
        code = "" if line is None else linecache.getline(*line).strip()
        self.tensor = describe(tensor, frame)
        super().__init__(f"NKI rule '{rule}' violated by {self.tensor}: {problem} "
                         f"(at {self.location}: {code})")


def _kernel_frame() -> FrameType | None:
    """The innermost frame whose code is not the emulator's: the kernel (or its helper)."""
    frame = inspect.currentframe()
    while frame is not None:
        if not os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
            return frame
        frame = frame.f_back
    return None


def describe(tensor: Any, frame: FrameType | None = None) -> str:
    """``'name' [shape] dtype in BUFFER`` for a tensor, naming it by the kernel variables that
    hold it (``'a/b'`` for aliases), else by the name it was given, else ``tile``."""
    target = getattr(tensor, "tensor", tensor)  # an access names the tensor it indexes
    names = [] if frame is None else [var for var, value in frame.f_locals.items()
                                      if value is target]
    name = "/".join(names) or getattr(target, "name", None)
    shape = getattr(tensor, "shape", None)
    if shape is None:
        return repr(tensor)
    buffer = getattr(target, "buffer", None)
    where = f" in {buffer.name}" if buffer is not None else ""
    dtype = getattr(target, "dtype", "")
    label = f"'{name}' " if name else "tile "
    return f"{label}{list(shape)} {dtype}{where}"
