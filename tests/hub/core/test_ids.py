"""The UUIDv7 format (hub.core.ids): properties over every timestamp and random input."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.core.ids import RANDOM_BYTES, format_uuid7s

timestamps = st.integers(min_value=0, max_value=2**48 - 1)


def randoms(count: st.SearchStrategy[int]) -> st.SearchStrategy[bytes]:
    return count.flatmap(lambda n: st.binary(min_size=n * RANDOM_BYTES, max_size=n * RANDOM_BYTES))


@given(timestamps, randoms(st.integers(min_value=0, max_value=8)))
def test_each_id_is_a_canonical_uuid7_of_its_timestamp_and_random_bits(
    ts: int, random: bytes
) -> None:
    ids = format_uuid7s(ts, random)
    assert len(ids) == len(random) // RANDOM_BYTES
    for k, text in enumerate(ids):
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # canonical: lower-case hex, 8-4-4-4-12
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert parsed.int >> 80 == ts  # unix_ts_ms: the top 48 bits
        # The 74 random bits: rand_a (12) and rand_b (62) come from this id's 10 bytes.
        r = int.from_bytes(random[k * RANDOM_BYTES : (k + 1) * RANDOM_BYTES], "big")
        rand_a = (parsed.int >> 64) & 0xFFF
        rand_b = parsed.int & (2**62 - 1)
        assert rand_a == r >> 68
        assert rand_b == ((r >> 64) & 0x3) << 60 | (r >> 4) & (2**60 - 1)


@given(timestamps, timestamps, randoms(st.just(1)), randoms(st.just(1)))
def test_ids_sort_by_their_timestamp(a: int, b: int, ra: bytes, rb: bytes) -> None:
    if a != b:
        (first,), (second,) = format_uuid7s(a, ra), format_uuid7s(b, rb)
        assert (first < second) == (a < b)


def test_a_timestamp_past_48_bits_keeps_its_low_bits() -> None:
    (text,) = format_uuid7s(2**48 + 5, bytes(RANDOM_BYTES))
    assert uuid.UUID(text).int >> 80 == 5


@pytest.mark.parametrize("size", [1, 9, 11])
def test_random_bytes_not_a_whole_number_of_ids_are_refused(size: int) -> None:
    with pytest.raises(ValueError):
        format_uuid7s(0, bytes(size))
