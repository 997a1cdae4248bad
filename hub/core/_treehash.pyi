"""The writer's Merkle hashing in C (hub/core/_treehash.c); hub.core.merkle.extend_canonical
calls it, hub.core.merkle.extend_canonical_py is the same in Python."""

from collections.abc import Sequence

def extend(
    frontier: Sequence[bytes], size: int, canonical: Sequence[bytes], grouped: bool, /
) -> tuple[list[bytes], tuple[bytes, ...]]: ...
