"""``check_gguf_layout``: a GGUF's header walked with every count, length, offset and size
checked against the bytes that are really there, before ``gguf.GGUFReader`` reads it.

The reader computes offsets in numpy's fixed-width integers and trusts the counts: a tensor
offset near 2**64 wraps around and is read from before the data section, a count of 2**63
keys loops until memory runs out. Here the same layout is read in Python's unbounded
integers, and each field is checked where it is read (a count against what the remaining
bytes can hold, a string or array against the end of the file, a tensor's extent against
the data section), so a malformed file is one error that names the field.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from octavo.models.loader.errors import ModelLoadError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20
# The fewest bytes one key/value pair and one tensor description take (an empty key and a
# one-byte value; an empty name, one dimension): what bounds their counts.
MIN_KV_BYTES = 8 + 4 + 1
MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8
SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


class _Cursor:
    """Little-endian reads from a buffer, each checked against its end."""

    def __init__(self, path: Path, data: mmap.mmap) -> None:
        self.path, self.data, self.pos = path, data, 0

    def fail(self, what: str, problem: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path}: not a readable GGUF file: {what}: {problem}")

    def take(self, size: int, what: str) -> int:
        """Advance over ``size`` bytes; where they start."""
        if size > len(self.data) - self.pos:
            raise self.fail(what, f"{size} bytes at offset {self.pos} run past the end of "
                                  f"the file ({len(self.data)} bytes)")
        start, self.pos = self.pos, self.pos + size
        return start

    def scalar(self, fmt: str, what: str) -> int | float | bool:
        value: int | float | bool = struct.unpack_from(
            fmt, self.data, self.take(struct.calcsize(fmt), what))[0]
        return value

    def u32(self, what: str) -> int:
        return int(self.scalar("<I", what))

    def u64(self, what: str) -> int:
        return int(self.scalar("<Q", what))

    def count(self, what: str, min_item_bytes: int) -> int:
        """A u64 count of items of at least ``min_item_bytes`` each: no more than fit."""
        count = self.u64(what)
        room = (len(self.data) - self.pos) // min_item_bytes
        if count > room:
            raise self.fail(what, f"{count} items cannot fit in the {len(self.data) - self.pos}"
                                  " bytes left")
        return count

    def string(self, what: str) -> str:
        length = self.u64(f"{what} length")
        start = self.take(length, what)
        try:
            return bytes(self.data[start:self.pos]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(what, f"not UTF-8 ({exc.reason})") from None


def check_gguf_layout(path: Path) -> None:
    """Raise ``ModelLoadError`` naming the field of ``path`` that breaks the GGUF layout."""
    try:
        with path.open("rb") as file:
            data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:  # unreadable, or empty (mmap refuses 0 bytes)
        raise ModelLoadError(f"{path}: not a readable GGUF file: {exc}") from None
    with data:
        _check(_Cursor(path, data))


def _check(cursor: _Cursor) -> None:
    if bytes(cursor.data[cursor.take(4, "magic"):cursor.pos]) != MAGIC:
        raise cursor.fail("magic", "the file does not start with 'GGUF'")
    version = cursor.u32("version")
    if version not in VERSIONS:
        raise cursor.fail("version", f"{version} is not supported ({VERSIONS})")
    tensor_count = cursor.count("tensor count", MIN_TENSOR_BYTES)
    kv_count = cursor.count("key/value count", MIN_KV_BYTES)
    alignment = DEFAULT_ALIGNMENT
    for index in range(kv_count):
        key = cursor.string(f"key {index}")
        value = _value(cursor, cursor.u32(f"{key!r} type"), key)
        if key == "general.alignment":
            alignment = _alignment(cursor, value)
    extents = [_tensor(cursor, index) for index in range(tensor_count)]
    data_start = -(-cursor.pos // alignment) * alignment
    data_size = len(cursor.data) - data_start
    for name, offset, size in extents:
        if offset % alignment:
            raise cursor.fail(f"tensor {name!r} offset", f"{offset} is not a multiple of the "
                                                         f"alignment {alignment}")
        if offset + size > data_size:
            raise cursor.fail(f"tensor {name!r} offset", f"{offset} + {size} bytes runs past "
                                                         f"the data section ({data_size} bytes)")


def _value(cursor: _Cursor, value_type: int, key: str) -> object:
    """Read (and check) one value of ``value_type``; arrays' items are skipped over."""
    if value_type == GGUFValueType.STRING:
        return cursor.string(f"{key!r} value")
    if value_type == GGUFValueType.ARRAY:
        item_type = cursor.u32(f"{key!r} array item type")
        item_format = SCALAR_FORMATS.get(_value_type(cursor, item_type, key))
        min_bytes = 8 if item_format is None else struct.calcsize(item_format)
        count = cursor.count(f"{key!r} array length", min_bytes)
        if item_format is not None:
            cursor.take(count * min_bytes, f"{key!r} array")
            return None
        for _ in range(count):
            _value(cursor, item_type, f"{key}[]")
        return None
    return cursor.scalar(SCALAR_FORMATS[_value_type(cursor, value_type, key)],
                         f"{key!r} value")


def _value_type(cursor: _Cursor, value_type: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(value_type)
    except ValueError:
        raise cursor.fail(f"{key!r} type", f"{value_type} is not a GGUF value type") from None


def _alignment(cursor: _Cursor, value: object) -> int:
    if (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_ALIGNMENT
            or value & (value - 1)):
        raise cursor.fail("general.alignment", f"{value!r} is not a power of two in "
                                               f"1..{MAX_ALIGNMENT}")
    return value


def _tensor(cursor: _Cursor, index: int) -> tuple[str, int, int]:
    """One tensor description: its name, offset in the data section and size in bytes."""
    name = cursor.string(f"tensor {index} name")
    n_dims = cursor.u32(f"tensor {name!r} dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cursor.fail(f"tensor {name!r} dimension count", f"{n_dims} is not in 1..{MAX_DIMS}")
    dims = [cursor.u64(f"tensor {name!r} dimension {i}") for i in range(n_dims)]
    ggml_type = cursor.u32(f"tensor {name!r} type")
    offset = cursor.u64(f"tensor {name!r} offset")
    try:
        block_elems, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise cursor.fail(f"tensor {name!r} type", f"{ggml_type} is not a GGML type") from None
    elements = 1
    for dim in dims:
        elements *= dim
    if elements == 0 or dims[0] % block_elems:
        raise cursor.fail(f"tensor {name!r} dimensions", f"{dims} (rows must be whole blocks "
                                                         f"of {block_elems} and none empty)")
    return name, offset, elements // block_elems * block_bytes
