"""One metadata string of a GGUF file (e.g. its ``tokenizer.chat_template``), read from the header without parsing
the tensors (the `gguf` package's reader maps them all: ~15 s for SmolLM2's 93 MiB file).

GGUF: magic ``GGUF``, uint32 version, uint64 tensor count, uint64 key-value count, then the key-value pairs (a key is
a uint64 length and UTF-8 bytes; a value a uint32 type and its data; arrays are an item type, a uint64 count, items).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def _read(fh: BinaryIO, fmt: str):
    size = struct.calcsize("<" + fmt)
    return struct.unpack("<" + fmt, fh.read(size))[0]


def _string(fh: BinaryIO) -> str:
    return fh.read(_read(fh, "Q")).decode("utf-8")


def _skip(fh: BinaryIO, kind: int) -> None:
    if kind == _STRING:
        fh.seek(_read(fh, "Q"), 1)
    elif kind == _ARRAY:
        item, count = _read(fh, "I"), _read(fh, "Q")
        if item in _SCALARS:
            fh.seek(struct.calcsize("<" + _SCALARS[item]) * count, 1)
        else:
            for _ in range(count):
                _skip(fh, item)
    else:
        fh.seek(struct.calcsize("<" + _SCALARS[kind]), 1)


def gguf_string(path: str | Path, key: str) -> str:
    """The string value of metadata `key` in the GGUF file `path` (KeyError when it has none)."""
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        _read(fh, "I")  # version
        _read(fh, "Q")  # tensors
        for _ in range(_read(fh, "Q")):
            name, kind = _string(fh), _read(fh, "I")
            if name == key and kind == _STRING:
                return _string(fh)
            _skip(fh, kind)
    raise KeyError(key)
