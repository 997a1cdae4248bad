"""Stored rows → events and heads: the one decoder every log store's reads and writer use.

A stored ``body`` is ``encode_event`` of the full sealed event (the other columns are
indexes). A page of bodies is decoded in ONE ``msgspec`` call over ``[body,body,…]``; only
when that fails are the bodies decoded one by one, to name the damaged row.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Final, Protocol

import msgspec

from hub.core.decoding import json_too_deep
from hub.core.errors import IntegrityError
from hub.core.events import Event, decode_event, decode_events
from hub.core.records import Head


def as_bytes(body: bytes | str) -> bytes:
    """A stored body as bytes. A body rewritten as TEXT (by the sqlite3 shell, say) must still
    reach the decoder, so that the hash check, not a TypeError, reports the tampering."""
    return body if isinstance(body, bytes) else str(body).encode("utf-8", "surrogatepass")


READ_MAX_DEPTH: Final = 256
"""The deepest stored event a reader accepts. The hub writes none deeper than ``[limits]
max_depth`` + 1; a deeper one (written before the limit existed) would break recursive
readers, so reading it raises :class:`IntegrityError` naming its row instead."""


class TooDeep(ValueError):
    """A stored body nests deeper than :data:`READ_MAX_DEPTH`."""


def decode_body(body: bytes) -> Event:
    """Decode one stored body. Raises ``msgspec.DecodeError``/``ValidationError`` or
    :class:`TooDeep`."""
    if json_too_deep(body, READ_MAX_DEPTH):
        raise TooDeep(f"nested deeper than {READ_MAX_DEPTH} levels")
    try:
        return decode_event(body)
    except RecursionError as e:  # belt and braces: the decoder's own recursion guard
        raise TooDeep(f"nested too deep to decode: {e}") from e


def decode_or_skip(body: bytes | str, seq: int) -> Event | None:
    """:func:`decode_body`, for a scan that goes on past a damaged row (a dead node's
    executions and members): None, logged with its seq, for a row that does not decode or
    nests too deep."""
    try:
        return decode_body(as_bytes(body))
    except UNDECODABLE as e:
        logging.getLogger("agora.log").error(
            "stored event at seq %d cannot be decoded (%s); skipped", seq, e
        )
        return None


def decode_joined(joined: bytes, *, legacy: bool = True) -> list[Event]:
    """Decode ``[body,body,…]`` in one call. Raises ``msgspec.DecodeError``/``ValidationError``
    or :class:`TooDeep` (the array adds one level). ``legacy=False``: the rows were all written
    by a hub that bounds nesting on write (a store created by this version), so the depth
    check is skipped — it would cost about as much as the decoding."""
    if legacy and json_too_deep(joined, READ_MAX_DEPTH + 1):
        raise TooDeep(f"nested deeper than {READ_MAX_DEPTH} levels")
    try:
        return decode_events(joined)
    except RecursionError as e:
        raise TooDeep(f"nested too deep to decode: {e}") from e


def _bracket_count(body: bytes) -> int:
    return body.count(b"[") + body.count(b"{")


def _may_nest_too_deep(body: bytes) -> bool:
    """Whether ``body`` is long enough to nest deeper than :data:`READ_MAX_DEPTH`: each level
    takes an opening bracket (a shorter body needs no count)."""
    return len(body) > READ_MAX_DEPTH


UNDECODABLE: Final = (msgspec.DecodeError, msgspec.ValidationError, TooDeep)
"""What :func:`decode_body` and :func:`decode_joined` raise for a damaged body."""


def decode_page(bodies: Sequence[bytes | str], keys: Iterable[int], key_name: str) -> list[Event]:
    """Decode stored bodies in one call; ``keys`` name their rows (``key_name`` is ``seq`` or
    ``position``). Raises :class:`IntegrityError` naming the first undecodable row (or one
    nested deeper than :data:`READ_MAX_DEPTH`)."""
    if not bodies:
        return []
    raw = [as_bytes(b) for b in bodies]
    try:
        # A body can nest deeper than READ_MAX_DEPTH only if it holds more brackets than that:
        # count them per body (C speed) and check the depth only of a page that has such a one.
        suspicious = max(map(_bracket_count, raw)) > READ_MAX_DEPTH
        return decode_joined(b"[" + b",".join(raw) + b"]", legacy=suspicious)
    except UNDECODABLE as e:
        for key, body in zip(keys, raw, strict=True):
            try:
                decode_body(body)
            except UNDECODABLE as bad:
                raise IntegrityError(
                    f"stored event at {key_name} {key} cannot be decoded: {bad}",
                    **{key_name: key},
                ) from bad
        raise IntegrityError(f"stored events cannot be decoded: {e}") from e


def join_bodies(bodies: Sequence[bytes | str], keys: Iterable[int], key_name: str) -> bytes:
    """Stored bodies as one JSON array ``[body,body,…]``, undecoded (for
    :meth:`hub.log.base.EventStore.read_joined`). Raises :class:`IntegrityError` naming the
    first row nested deeper than :data:`READ_MAX_DEPTH`, as :func:`decode_page` would."""
    raw = [as_bytes(b) for b in bodies]
    check_depth(raw, keys, key_name)
    return b"[" + b",".join(raw) + b"]"


def check_depth(raw: Sequence[bytes], keys: Iterable[int], key_name: str) -> None:
    """Raise :class:`IntegrityError` naming the first of the stored bodies ``raw`` nested
    deeper than :data:`READ_MAX_DEPTH` (what :func:`decode_page` refuses), for the readers that
    hand stored bytes on undecoded (:func:`join_bodies`, a subscription's catch-up:
    :meth:`hub.workspaces.Workspaces.read_raw`). Costs one bracket count per body longer than
    that (and a full check only of a page with a body holding that many brackets)."""
    if (
        raw
        and max(map(_bracket_count, filter(_may_nest_too_deep, raw)), default=0) > READ_MAX_DEPTH
    ):
        for key, body in zip(keys, raw, strict=True):
            if json_too_deep(body, READ_MAX_DEPTH):
                bad = TooDeep(f"nested deeper than {READ_MAX_DEPTH} levels")
                raise IntegrityError(
                    f"stored event at {key_name} {key} cannot be decoded: {bad}",
                    **{key_name: key},
                ) from bad


class Row(Protocol):
    """A database row (a tuple, an ``asyncpg.Record``): indexable by column number."""

    def __getitem__(self, index: int, /) -> Any: ...


def head_from_row(row: Row) -> Head:
    """A :class:`Head` from a row of ``(workspace, seq, hash, timestamp, position)``."""
    return Head(workspace=row[0], seq=row[1], hash=row[2], timestamp=row[3], position=row[4])
