"""Minted event ids (hub.log.ids)."""

from __future__ import annotations

import uuid

from hub.log.ids import mint_id, mint_ids


def test_mint_id_is_a_time_ordered_uuid() -> None:
    ids = [mint_id(1_700_000_000_000 + i) for i in range(100)]
    assert ids == sorted(ids) and len(set(ids)) == 100
    parsed = uuid.UUID(ids[0])
    assert str(parsed) == ids[0] and parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert len({mint_id(5) for _ in range(1000)}) == 1000


def test_one_call_mints_a_batch_of_distinct_ids_of_one_millisecond() -> None:
    ids = mint_ids(1_700_000_000_000, 64)
    assert len(set(ids)) == 64
    assert {i[:13] for i in ids} == {mint_id(1_700_000_000_000)[:13]}
