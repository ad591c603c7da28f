"""Hostile zips written structure by structure: 600,000 entries in a second, and end records that lie.

zipfile takes minutes to write 600,000 entries and never writes a lie; the daemon must judge both from the
bytes. Every entry is an empty stored file (a 30-byte local header and its name), so an archive of N entries
takes about N x (76 + 2 x name) bytes; a count above 65,535 makes a zip64 end record, as zip tools do.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

LOCAL = struct.Struct("<4s5H3L2H")
CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
EOCD = struct.Struct("<4s4H2LH")
EOCD64 = struct.Struct("<4sQ2H2L4Q")
LOCATOR = struct.Struct("<4sLQL")
EMPTY_CRC = 0
UTF8 = 0x800


def craft(
    names: list[str],
    declared: int | None = None,
    directory_size: int | None = None,
    zip64: bool | None = None,
    comment: bytes = b"",
) -> bytes:
    """A zip of empty stored files named ``names``; ``declared`` and ``directory_size`` replace what the end
    record says (the directory itself stays as written); ``zip64`` forces or forbids the zip64 end record."""
    local, central = bytearray(), bytearray()
    for name in names:
        raw = name.encode()
        offset = len(local)
        local += LOCAL.pack(b"PK\x03\x04", 20, UTF8, 0, 0, 0x21, EMPTY_CRC, 0, 0, len(raw), 0) + raw
        central += CENTRAL.pack(
            b"PK\x01\x02", 20, 3, 20, 0, UTF8, 0, 0, 0x21, EMPTY_CRC, 0, 0, len(raw), 0, 0, 0, 0, 0o100644 << 16, offset
        )
        central += raw
    return (
        local
        + central
        + end_record(
            len(local),
            len(names) if declared is None else declared,
            len(central) if directory_size is None else directory_size,
            len(names) > 0xFFFF if zip64 is None else zip64,
            comment,
        )
    )


def end_record(offset: int, entries: int, size: int, zip64: bool, comment: bytes = b"") -> bytes:
    """The end of central directory (and, for zip64, its record and locator) of a directory at ``offset``."""
    out = b""
    if zip64:
        record_at = offset + size
        out += EOCD64.pack(b"PK\x06\x06", EOCD64.size - 12, 45, 45, 0, 0, entries, entries, size, offset)
        out += LOCATOR.pack(b"PK\x06\x07", 0, record_at, 1)
        entries16, size32, offset32 = 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF
    else:
        entries16, size32, offset32 = min(entries, 0xFFFF), min(size, 0xFFFFFFFF), min(offset, 0xFFFFFFFF)
    return out + EOCD.pack(b"PK\x05\x06", 0, 0, entries16, entries16, size32, offset32, len(comment)) + comment


def hostile_zip(path: Path, model: str, entries: int) -> int:
    """Write a zip of ``entries`` empty files under ``<model>/1/`` to ``path``; its size in bytes."""
    data = craft([f"{model}/1/{i:x}" for i in range(entries)])
    path.write_bytes(data)
    return len(data)


def hostile_manifest(path: Path, entries: int, empty: bool = False) -> int:
    """Write a manifest of ``entries`` files (or of empty objects) to ``path``; its size in bytes."""
    sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    with open(path, "w") as f:
        f.write('{"files": [')
        f.write(json.dumps({"path": "config.pbtxt", "size": 0, "sha256": sha}))
        for i in range(entries - 1):
            f.write(",{}" if empty else f',{{"path": "1/f{i:x}", "size": 0, "sha256": "{sha}"}}')
        f.write("]}")
    return path.stat().st_size
