"""Retry delays: one exponential backoff with jitter for every retry loop in Agora.

The client's reconnects, the PostgreSQL store's LISTEN connection, the cluster follower and
heartbeat, the A2A bridge, the A2A push deliveries and the workspaces' re-decide all wait
with :class:`Backoff`: the delay before attempt ``n`` is ``initial * factor**n`` capped at
``maximum``, times a jitter in ``[1 - jitter, 1]`` so that many retrying clients do not
stampede in step. Pure: the caller sleeps; the random source is injectable for tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    """Delays ``initial * factor**attempt`` capped at ``maximum``, each scaled by a random value
    in ``[1 - jitter, 1]``; ``give_up_after`` seconds bounds how long a caller keeps retrying
    (None: never gives up)."""

    initial: float = 0.05
    maximum: float = 2.0
    factor: float = 2.0
    jitter: float = 0.5
    give_up_after: float | None = 30.0

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """The delay in seconds before retry number ``attempt`` (0 for the first retry)."""
        base = min(self.maximum, self.initial * self.factor ** min(max(attempt, 0), 64))
        return base * (1.0 - self.jitter * rand())  # jitter, not cryptography
