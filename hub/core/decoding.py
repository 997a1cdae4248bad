"""The decode policy of every door: JSON nested deeper than a limit is refused before any decoder
or recursive walk sees it.

A JSON document nested ~1,000 levels deep makes a recursive decoder, encoder or fold raise
``RecursionError``; stored, it would break every later reader of the log. So each door
(WebSocket frames, A2A bodies, ``agora append``/``import``, values coming back from backends,
reads from the store) checks the nesting depth first: :func:`check_json_depth` on bytes,
:func:`check_value_depth` on an already-built Python value. Both are iterative (no recursion
of their own) and stop as soon as the limit is passed. The limit is ``[limits] max_depth``
(:class:`hub.core.validation.Limits`, default 64).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from hub.core.errors import BadRequest

__all__ = ["check_json_depth", "check_value_depth", "json_too_deep", "value_too_deep"]

# A JSON string: its brackets do not nest. The unrolled form keeps the regex linear.
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(range(256)).translate(None, b"[]{}")  # every byte but the brackets
_AS_SQUARE: Final = bytes.maketrans(b"{}", b"[]")  # objects nest like arrays


def _reduces_within(text: bytes, limit: int) -> bool | None:
    """The brackets of ``text`` (``[`` and ``{`` alike), reduced by removing every innermost
    pair ``[]`` per pass: True if nothing is left within ``limit`` passes, False if something
    still is after them, None if the reduction stops short (unbalanced brackets are left)."""
    brackets = text.translate(_AS_SQUARE, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return True
        reduced = brackets.replace(b"[]", b"")
        if reduced == brackets:
            return None
        brackets = reduced
    return not brackets


def json_too_deep(data: bytes | str, limit: int) -> bool:
    """Whether the JSON text ``data`` nests deeper than ``limit`` (a scalar has depth 0).
    Brackets inside strings do not count; malformed text gives a best-effort answer (the
    decoder then refuses it).

    Done with bytes operations, not a loop per character: a document of depth d is empty
    after exactly d passes that each remove every innermost pair of brackets. Brackets inside
    strings can only add passes (they sit between real pairs until they pair up themselves),
    so a first reduction of the raw text that empties within ``limit`` passes proves the text
    shallow enough at C speed (a page of a thousand stored events in microseconds); only text
    that might be deeper is reduced again with its strings removed, which is exact.
    """
    if isinstance(data, str):
        if data.count("[") + data.count("{") <= limit:
            return False  # the common case, decided without encoding the text
        raw = data.encode("utf-8", "surrogatepass")
    else:
        raw = data
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False  # fewer brackets than the limit: cannot nest deeper (the common case)
    if _reduces_within(raw, limit):
        return False
    # With escapes, strip whole strings with the regex; without, every other piece is outside.
    outside = _STRING.sub(b"", raw) if b"\\" in raw else b"".join(raw.split(b'"')[0::2])
    exact = _reduces_within(outside, limit)
    if exact is None:  # unbalanced, so malformed: deep if a run of openers passes the limit
        left = outside.translate(_AS_SQUARE, _NOT_BRACKETS)
        while (shorter := left.replace(b"[]", b"")) != left:
            left = shorter
        return left.count(b"[") > limit or left.count(b"]") > limit
    return not exact


def value_too_deep(value: Any, limit: int) -> bool:
    """Whether a JSON-like Python value nests deeper than ``limit`` (dicts, lists and tuples
    nest; a scalar has depth 0). Iterative: safe on any depth."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        elif isinstance(item, msgspec.Struct):
            children = msgspec.structs.astuple(item)  # a typed payload: its fields nest too
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _too_deep(field: str, limit: int) -> BadRequest:
    return BadRequest(
        f"{field} is nested deeper than the limit of {limit} levels", field=field, limit=limit
    )


def check_json_depth(data: bytes | str, max_depth: int, field: str = "$") -> None:
    """Raise :class:`BadRequest` (details ``field``, ``limit``) if the JSON text ``data`` nests
    deeper than ``max_depth``."""
    if json_too_deep(data, max_depth):
        raise _too_deep(field, max_depth)


def check_value_depth(value: Any, max_depth: int, field: str) -> None:
    """Raise :class:`BadRequest` (details ``field``, ``limit``) if ``value`` nests deeper than
    ``max_depth``."""
    if value_too_deep(value, max_depth):
        raise _too_deep(field, max_depth)
