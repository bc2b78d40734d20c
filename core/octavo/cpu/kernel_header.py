"""The CPU kernels' C interface as ctypes sees it, read from their header (octavo_cpu.h):
its integer constants, its structs' fields and its entry points' signatures.

Why: the header is the one place the interface is written. The compiler checks every C
definition against it, this module derives the ctypes side from it when ``octavo.cpu.kernels``
is imported, and ``tests/core/cpu/test_cpu_interface.py`` compares the structs' layouts with the
compiler's own (``octavo_layout``), so a mismatch fails a test instead of corrupting memory.

Why a reader of our own rather than a binding tool: cffi's ABI mode also parses C
declarations, but it would be a new dependency that cannot read the header's field-list
macros, and its calls take pointers as cdata, not the integers ``Tensor.data_ptr()`` gives,
which adds a cast per pointer argument to every call; a torch extension (``torch.library``)
compiles C++ against torch's headers, tens of seconds on first use instead of a few, and
each call then goes through the dispatcher, which costs more than a ctypes call. The header
keeps to the restricted C its own comment lists, and anything else is refused with the
statement that could not be read.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

# ctypes for the C types the header may use; any pointer is c_void_p (callers pass
# Tensor.data_ptr() integers, None, arrays or byref()), but char * is c_char_p (text).
SCALARS: dict[str, Any] = {"int": ctypes.c_int, "int64_t": ctypes.c_int64,
                           "uint16_t": ctypes.c_uint16, "float": ctypes.c_float,
                           "double": ctypes.c_double, "void": None}

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
_CONSTANT = re.compile(r"#define\s+(\w+)\s+(-?\d+)")
_FIELD_LIST = re.compile(r"#define\s+(\w+)\(FIELD\)\s*(.*)")
_FIELD = re.compile(r"\s*FIELD\(([^,()]+),\s*(\w+)\)\s*")
_TYPEDEF_STRUCT = re.compile(r"typedef\s+struct\s*\{\s*(\w+)\(OCTAVO_FIELD\)\s*\}\s*(\w+)")
_TYPEDEF = re.compile(r"typedef\s+(\w+)\s+(\w+)")
_FUNCTION = re.compile(r"(.+?)\b(\w+)\s*\((.*)\)", re.DOTALL)
_PARAMETER = re.compile(r"(.+?)\b(\w+)")


@dataclass(frozen=True)
class Function:
    """An entry point's ctypes signature."""

    restype: Any
    argtypes: list[Any]


@dataclass(frozen=True)
class Header:
    """What octavo_cpu.h declares, in ctypes terms."""

    path: Path
    constants: dict[str, int]
    structs: dict[str, list[tuple[str, Any]]]  # C name -> ctypes ``_fields_``
    functions: dict[str, Function]

    def fields(self, struct: str) -> list[tuple[str, Any]]:
        """``_fields_`` for a ctypes Structure of ``struct``."""
        return list(self.structs[struct])

    def bind(self, lib: ctypes.CDLL) -> None:
        """Declare every entry point's argument and result types on ``lib``."""
        for name, function in self.functions.items():
            foreign = getattr(lib, name)
            foreign.argtypes = function.argtypes
            foreign.restype = function.restype


def read_header(path: Path) -> Header:
    """Parse the header at ``path``; ValueError naming what it could not read."""
    text = _COMMENT.sub(" ", path.read_text()).replace("\\\n", " ")
    constants: dict[str, int] = {}
    field_lists: dict[str, list[tuple[str, str]]] = {}
    code = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("#"):
            code.append(line)
        elif match := _CONSTANT.fullmatch(line):
            constants[match[1]] = int(match[2])
        elif match := _FIELD_LIST.fullmatch(line):
            field_lists[match[1]] = _fields(path, match[1], match[2])
        # other directives (the include guard, #include, helper macros) declare nothing
    reader = _Statements(path)
    for statement in " ".join(code).split(";"):
        reader.add(statement.strip(), field_lists)
    return Header(path, constants, reader.structs, reader.functions)


def _fields(path: Path, macro: str, body: str) -> list[tuple[str, str]]:
    """The (type, name) pairs of a ``NAME(FIELD) FIELD(type, name) ...`` list."""
    pairs = [(match[1].strip(), match[2]) for match in _FIELD.finditer(body)]
    if "".join(match[0] for match in _FIELD.finditer(body)) != body:
        raise ValueError(f"{path}: {macro} holds something other than FIELD(type, name) "
                         f"entries: {body!r}")
    return pairs


class _Statements:
    """The typedefs and prototypes of the header, statement by statement."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.aliases: dict[str, str] = {}
        self.structs: dict[str, list[tuple[str, Any]]] = {}
        self.functions: dict[str, Function] = {}

    def add(self, statement: str, field_lists: dict[str, list[tuple[str, str]]]) -> None:
        if not statement:
            return
        if match := _TYPEDEF_STRUCT.fullmatch(statement):
            if match[1] not in field_lists:
                raise ValueError(f"{self.path}: struct {match[2]} names an unknown field "
                                 f"list {match[1]}")
            self.structs[match[2]] = [(name, self.ctype(kind))
                                      for kind, name in field_lists[match[1]]]
        elif match := _TYPEDEF.fullmatch(statement):
            self.aliases[match[2]] = match[1]
        elif match := _FUNCTION.fullmatch(statement):
            params = [] if match[3].strip() == "void" else match[3].split(",")
            self.functions[match[2]] = Function(self.ctype(match[1]),
                                                [self.parameter(p) for p in params])
        else:
            raise ValueError(f"{self.path}: cannot read {statement!r} (the header keeps to "
                             f"the restricted C its first comment lists)")

    def parameter(self, declaration: str) -> Any:
        match = _PARAMETER.fullmatch(declaration.strip())
        if match is None:
            raise ValueError(f"{self.path}: cannot read the parameter {declaration!r}")
        return self.ctype(match[1])

    def ctype(self, declaration: str) -> Any:
        """The ctype of a C type such as ``const bf16 *`` or ``int64_t``."""
        words = declaration.replace("*", " * ").split()
        stars = words.count("*")
        base = " ".join(w for w in words if w not in ("*", "const"))
        base = self.aliases.get(base, base)
        if stars:
            return ctypes.c_char_p if (base, stars) == ("char", 1) else ctypes.c_void_p
        if base not in SCALARS:
            raise ValueError(f"{self.path}: no ctype for the C type {declaration!r}")
        return SCALARS[base]


class CStruct(ctypes.Structure):
    """A struct of the header (``c_name``; ``_fields_`` from :meth:`Header.fields`), made by
    keyword with every field given: a field the header gains and a caller does not fill is
    an error naming it, not a silent zero."""

    c_name: ClassVar[str]
    _names: ClassVar[frozenset[str]]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls._names = frozenset(field[0] for field in cls._fields_)

    def __init__(self, **values: Any) -> None:
        if values.keys() != self._names:
            problems = [f"no value for {name}" for name in sorted(self._names - values.keys())]
            problems += [f"no field named {name}" for name in sorted(values.keys() - self._names)]
            raise TypeError(f"{self.c_name}: {', '.join(problems)}")
        super().__init__(**values)


@dataclass(frozen=True)
class Layout:
    """A struct's size and its fields' (name, offset, size), in order."""

    size: int
    fields: tuple[tuple[str, int, int], ...]


def ctypes_layout(struct: type[ctypes.Structure]) -> Layout:
    """How ctypes lays ``struct`` out."""
    fields = tuple((field[0], getattr(struct, field[0]).offset, getattr(struct, field[0]).size)
                   for field in struct._fields_)
    return Layout(ctypes.sizeof(struct), fields)
