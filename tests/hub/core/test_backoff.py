"""The one retry backoff (hub/core/backoff.py): exponential, capped, jittered downwards."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.core.backoff import Backoff

attempts = st.integers(min_value=-5, max_value=10_000)
unit = st.floats(min_value=0.0, max_value=1.0)
backoffs = st.builds(
    Backoff,
    initial=st.floats(min_value=0.001, max_value=5.0),
    maximum=st.floats(min_value=0.001, max_value=60.0),
    factor=st.floats(min_value=1.0, max_value=4.0),
    jitter=st.floats(min_value=0.0, max_value=1.0),
)


def test_without_jitter_the_delays_double_up_to_the_cap() -> None:
    backoff = Backoff(initial=0.1, maximum=1.0, factor=2.0, jitter=0.0)
    delays = [backoff.delay(n) for n in range(6)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_jitter_scales_the_delay_down_by_at_most_jitter() -> None:
    backoff = Backoff(initial=1.0, maximum=10.0, jitter=0.5)
    assert backoff.delay(0, rand=lambda: 0.0) == pytest.approx(1.0)
    assert backoff.delay(0, rand=lambda: 1.0) == pytest.approx(0.5)
    assert backoff.delay(1, rand=lambda: 0.5) == pytest.approx(1.5)


@given(backoffs, attempts, unit)
def test_every_delay_is_within_the_jittered_capped_band(
    backoff: Backoff, attempt: int, r: float
) -> None:
    delay = backoff.delay(attempt, rand=lambda: r)
    ceiling = min(backoff.maximum, backoff.initial * backoff.factor ** min(max(attempt, 0), 64))
    assert ceiling * (1.0 - backoff.jitter) - 1e-9 <= delay <= ceiling + 1e-9
    assert delay <= backoff.maximum + 1e-9


@given(backoffs, attempts)
def test_later_attempts_never_wait_less_before_jitter(backoff: Backoff, attempt: int) -> None:
    def top(n: int) -> float:
        return backoff.delay(n, rand=lambda: 0.0)

    assert top(attempt + 1) >= top(attempt) - 1e-9


def test_a_negative_attempt_is_the_first_and_a_huge_one_does_not_overflow() -> None:
    backoff = Backoff(jitter=0.0)
    assert backoff.delay(-3) == backoff.delay(0) == pytest.approx(backoff.initial)
    assert backoff.delay(10**9) == pytest.approx(backoff.maximum)


def test_defaults_retry_for_a_bounded_time() -> None:
    backoff = Backoff()
    assert backoff.give_up_after is not None and backoff.give_up_after > 0
    assert 0 < backoff.initial <= backoff.maximum
