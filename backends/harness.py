"""Output handling shared by every backend: caps, UTF-8-safe truncation, structured output.
Pure.

* :class:`OutputCap` bounds one stream: it passes bytes through until the cap, cuts at the cap
  without splitting a UTF-8 character, then counts (and drops) everything after. The chunks a
  backend streams are exactly the bytes the result keeps.
* :func:`extract_value` is adk-code's structured-output rule: when the last line of stdout
  parses as JSON it is the ``value``, and the rest is the displayed stdout.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

__all__ = ["OutputCap", "extract_value", "incomplete_tail", "truncate_utf8", "utf8_cut"]

_json_decoder: Final = msgspec.json.Decoder()


def utf8_cut(data: bytes, limit: int) -> int:
    """The largest ``n <= limit`` such that ``data[:n]`` does not end inside a UTF-8 character.

    Only a cut through a well-formed multi-byte sequence moves back (at most 3 bytes); bytes
    that are not UTF-8 are cut at ``limit`` as they are.
    """
    if limit >= len(data):
        return len(data)
    if limit <= 0:
        return 0
    # Walk back over continuation bytes (10xxxxxx) to the lead byte of the character at the cut.
    start = limit
    while start > 0 and limit - start < 3 and data[start] & 0xC0 == 0x80:
        start -= 1
    if start == limit:
        return limit  # the cut is at a character boundary already
    width = _sequence_width(data[start])
    if not width:
        return limit  # not a lead byte: not UTF-8 here, cut as is
    return start if start + width > limit else limit


def truncate_utf8(data: bytes, limit: int) -> tuple[bytes, bool]:
    """``data`` cut to at most ``limit`` bytes at a character boundary, and whether it was cut."""
    if len(data) <= limit:
        return data, False
    return data[: utf8_cut(data, limit)], True


def incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` start a UTF-8 character that is not complete yet
    (0 when ``data`` ends at a character boundary or is not UTF-8 there)."""
    n = len(data)
    for back in range(1, min(3, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: keep looking for the lead byte
        return back if _sequence_width(byte) > back else 0
    return 0


def _sequence_width(lead: int) -> int:
    """The length of the UTF-8 sequence that ``lead`` starts (2-4), or 0 when it does not start
    a multi-byte sequence (ASCII, a continuation byte, an invalid byte)."""
    if lead & 0xE0 == 0xC0:
        return 2
    if lead & 0xF0 == 0xE0:
        return 3
    if lead & 0xF8 == 0xF0:
        return 4
    return 0


class OutputCap:
    """The cap of one output stream.

    :meth:`feed` returns the part of a chunk to keep (possibly empty). A UTF-8 character split
    across chunks is held back until it is complete, so a kept chunk never ends inside one and
    the cut at the cap is always at a character boundary. After the cap is reached every later
    byte is dropped but counted in :attr:`total`, and :attr:`truncated` is set. Call
    :meth:`flush` at end of stream for any held-back bytes.
    """

    __slots__ = ("_carry", "kept", "limit", "total", "truncated")

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.kept = 0
        self.total = 0
        self.truncated = False
        self._carry = b""

    def feed(self, data: bytes) -> bytes:
        self.total += len(data)
        if self.truncated:
            return b""
        if self._carry:
            data = self._carry + data
            self._carry = b""
        tail = incomplete_tail(data)
        if tail:
            self._carry = data[-tail:]
            data = data[:-tail]
        return self._keep(data)

    def flush(self) -> bytes:
        """At end of stream: the held-back bytes of an unfinished character, if they fit."""
        data, self._carry = self._carry, b""
        if self.truncated or not data:
            return b""
        return self._keep(data)

    def _keep(self, data: bytes) -> bytes:
        room = self.limit - self.kept
        if len(data) <= room:
            self.kept += len(data)
            return data
        keep = data[: utf8_cut(data, room)]
        self.kept += len(keep)
        self.truncated = True
        self._carry = b""
        return keep


def extract_value(stdout: bytes) -> tuple[bytes, Any]:
    """Split structured output off ``stdout``: ``(displayed stdout, value)``.

    The value is the last line (ignoring one trailing newline) when it parses as JSON; it is
    removed from the displayed stdout. Otherwise the value is ``msgspec.UNSET`` and stdout is
    unchanged.
    """
    body = stdout[:-1] if stdout.endswith(b"\n") else stdout
    if not body.strip():
        return stdout, msgspec.UNSET
    cut = body.rfind(b"\n") + 1
    line = body[cut:].strip()
    try:
        value = _json_decoder.decode(line)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return stdout, msgspec.UNSET
    return stdout[:cut], value
