"""An independent reference for RFC 9162 §2.1, written from the RFC's text for the tests.

It shares no code with ``hub``: the tree head (§2.1.1), the audit path (§2.1.3.1) and the
consistency proof (§2.1.4.1) straight from the recursive definitions over the list of leaf
inputs, and the two verification algorithms (§2.1.3.2, §2.1.4.2) step by step as the RFC
writes them (the hub's own checkers walk the recursive definitions instead).
"""

from __future__ import annotations

import hashlib


class ReferenceError(Exception):
    """A proof the RFC's verification algorithm rejects."""


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _k(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(d: list[bytes]) -> bytes:
    """MTH(D[n]) of §2.1.1."""
    n = len(d)
    if n == 0:
        return _h(b"")
    if n == 1:
        return _h(b"\x00" + d[0])
    k = _k(n)
    return _h(b"\x01" + mth(d[:k]) + mth(d[k:]))


def path(m: int, d: list[bytes]) -> list[bytes]:
    """PATH(m, D[n]) of §2.1.3.1."""
    n = len(d)
    if n == 1:
        return []
    k = _k(n)
    if m < k:
        return [*path(m, d[:k]), mth(d[k:])]
    return [*path(m - k, d[k:]), mth(d[:k])]


def proof(m: int, d: list[bytes]) -> list[bytes]:
    """PROOF(m, D[n]) of §2.1.4.1 (0 < m < n)."""
    return _subproof(m, d, True)


def _subproof(m: int, d: list[bytes], b: bool) -> list[bytes]:
    n = len(d)
    if m == n:
        return [] if b else [mth(d)]
    k = _k(n)
    if m <= k:
        return [*_subproof(m, d[:k], b), mth(d[k:])]
    return [*_subproof(m - k, d[k:], False), mth(d[:k])]


def verify_inclusion(
    leaf_index: int, tree_size: int, leaf_hash: bytes, inclusion_path: list[bytes], root: bytes
) -> None:
    """§2.1.3.2, step by step. Raises :class:`ReferenceError`."""
    if leaf_index >= tree_size:
        raise ReferenceError("leaf_index >= tree_size")
    fn = leaf_index
    sn = tree_size - 1
    r = leaf_hash
    for p in inclusion_path:
        if sn == 0:
            raise ReferenceError("sn is 0 before the path ended")
        if fn & 1 or fn == sn:
            r = _h(b"\x01" + p + r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = _h(b"\x01" + r + p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ReferenceError("sn is not 0 at the end")
    if r != root:
        raise ReferenceError("computed root differs")


def verify_consistency(
    first: int, second: int, first_hash: bytes, second_hash: bytes, consistency_path: list[bytes]
) -> None:
    """§2.1.4.2, step by step (0 < first < second). Raises :class:`ReferenceError`."""
    if not consistency_path:
        raise ReferenceError("empty consistency path")
    p = list(consistency_path)
    # Step 1: if first is an exact power of 2, prepend first_hash.
    if first & (first - 1) == 0:
        p = [first_hash, *p]
    fn = first - 1
    sn = second - 1
    # Step 3: if LSB(fn) is set, right-shift both until it is not.
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = p[0]
    for c in p[1:]:
        if sn == 0:
            raise ReferenceError("sn is 0 before the path ended")
        if fn & 1 or fn == sn:
            fr = _h(b"\x01" + c + fr)
            sr = _h(b"\x01" + c + sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = _h(b"\x01" + sr + c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ReferenceError("sn is not 0 at the end")
    if fr != first_hash or sr != second_hash:
        raise ReferenceError("computed roots differ")
