"""The per-workspace Merkle tree (RFC 9162 §2.1) as pure functions. No I/O.

Leaves are the workspace's events in seq order; the tree over the first ``n`` events is the
tree of size ``n`` (tree size = seq), so leaf ``i`` (0-based) is the event of seq ``i + 1``.
Hashes (RFC 9162 §2.1.1)::

    leaf  = SHA-256(0x00 || canonical bytes of the event)   (hub.core.chain.canonical_bytes)
    node  = SHA-256(0x01 || left || right)
    empty = SHA-256("")

**Stored hashes.** After golang.org/x/mod/sumdb/tlog, every complete (perfect) subtree's hash
is kept in one dense, append-only sequence per workspace: appending leaf ``n`` adds the leaf's
hash, then the hash of each perfect subtree that leaf completes (1 + the number of trailing
one bits of ``n``: at most 1 + log2 n, just under two on average). :func:`stored_hash_index`
maps tree coordinates (level, index within the level) to the position in that sequence. Any
tree head or proof is a fold of at most O(log n) stored hashes.

**Frontier.** To append without reading anything back, the writer keeps the *frontier* (the
compact range [0, n)): the hashes of the perfect subtrees that tile the tree of size ``n``,
largest first, one per set bit of ``n``. :func:`append_leaf` turns the frontier of size ``n``
into that of ``n + 1`` and returns the stored hashes to add.

**Reading.** The computing functions read stored hashes through a :class:`HashReader` (a
plain, synchronous lookup). They first say which indexes they need (``*_indexes``), so the
I/O layer fetches those in one query and hands over a :class:`MappingReader`; the core never
waits on anything.

Internal invariants are asserted ("bad math": a bug, never input); a proof that does not check
out raises :class:`ProofError`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final, Protocol, TypeAlias

from hub.core.errors import IntegrityError

_Extend: TypeAlias = Callable[
    [Sequence[bytes], int, Sequence[bytes], bool], tuple[list[bytes], tuple[bytes, ...]]
]


def _load_c() -> _Extend | None:
    """The writer's hashing in C (hub/core/_treehash.c), where it was built: it is optional
    (pip install needs no compiler); without it extend_canonical_py does the same, slower."""
    try:
        from hub.core._treehash import extend
    except ImportError:
        return None
    return extend


_extend_c: Final = _load_c()

HASH_SIZE: Final = 32
EMPTY_ROOT: Final = hashlib.sha256(b"").digest()
LEAF_PREFIX: Final = b"\x00"  # RFC 9162 §2.1.1: a leaf hash is SHA-256(0x00 ‖ data)
_NODE: Final = b"\x01"


class ProofError(IntegrityError):
    """A tree head, inclusion proof or consistency proof does not check out (the log, or
    whoever handed over the proof, is not what was signed). ``details`` say which check."""


class HashReader(Protocol):
    """Looks stored hashes up by :func:`stored_hash_index` (what every store keeps)."""

    def read_hashes(self, indexes: Sequence[int]) -> Sequence[bytes]:
        """The stored hash at each index, in the order asked. Raises ``KeyError`` (or the
        store's error) for one that is not stored."""
        ...


class MappingReader:
    """A :class:`HashReader` over hashes already fetched (index → hash)."""

    __slots__ = ("_hashes",)

    def __init__(self, hashes: Mapping[int, bytes]) -> None:
        self._hashes = hashes

    def read_hashes(self, indexes: Sequence[int]) -> Sequence[bytes]:
        return [self._hashes[i] for i in indexes]


# -- hashing (RFC 9162 §2.1.1) ----------------------------------------------------------------


def leaf_hash(data: bytes) -> bytes:
    """SHA-256(0x00 || data): the hash of one leaf."""
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right): the hash of an interior node."""
    return hashlib.sha256(_NODE + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n > 1): where RFC 9162 splits a tree."""
    assert n > 1, "bad math: no split of a tree with fewer than two leaves"
    return 1 << ((n - 1).bit_length() - 1)


# -- the stored hash index (sumdb/tlog's StoredHashIndex) -------------------------------------


def stored_hash_index(level: int, index: int) -> int:
    """Where the hash of the perfect subtree (``level``, ``index``) — leaves
    ``[index << level, (index + 1) << level)`` — sits in the stored sequence."""
    assert level >= 0 and index >= 0, "bad math: negative tree coordinates"
    # As tlog: the subtree is stored with its last leaf n = 2^level·(index+1) - 1, ``level``
    # hashes after n's own. Leaf k stores 1 + trailing-ones(k) hashes, and the trailing ones
    # of 0..n-1 sum to n - popcount(n): n's own hash is number 2n - popcount(n) (tlog sums
    # n + n/2 + n/4 + …, the same in a loop). O(1): this runs for every hash of a proof.
    n = ((index + 1) << level) - 1
    return 2 * n - n.bit_count() + level


def stored_hash_count(size: int) -> int:
    """How many hashes are stored for a tree of ``size`` leaves (see
    :func:`stored_hash_index`: the leaves before ``size`` store 2·size - popcount(size))."""
    assert size >= 0, "bad math: negative size"
    return 2 * size - size.bit_count()


def stored_hash_leaf(stored: int) -> tuple[int, int]:
    """The inverse of :func:`stored_hash_index`, as a place in the leaves' groups: (the leaf
    ``n`` whose append stored hash ``stored``, its offset in that leaf's group). Appending
    leaf ``n`` stores a group of 1 + trailing-ones(n) hashes: the leaf's own, then the
    subtree of each level it completes, so offset = the subtree's level (tlog's
    SplitStoredHashIndex). A store that keeps each leaf's group beside its event finds a
    stored hash here."""
    assert stored >= 0, "bad math: negative stored index"
    # stored_hash_index(0, n) = 2n - popcount(n) <= 2n: the leaf is in [stored/2, ...],
    # at most log2 steps on.
    n = stored // 2
    first = 2 * n - n.bit_count()
    while True:
        after = first + group_size(n)
        if after > stored:
            return n, stored - first
        n, first = n + 1, after


def group_size(leaf: int) -> int:
    """How many hashes appending leaf ``leaf`` (0-based) stores: 1 + trailing-ones(leaf)."""
    return ((leaf + 1) & -(leaf + 1)).bit_length()


def frontier_coordinates(size: int) -> list[tuple[int, int]]:
    """The (level, index) of each perfect subtree tiling the tree of ``size``, largest
    first: one per set bit of ``size``."""
    coords: list[tuple[int, int]] = []
    start = 0
    for level in range(size.bit_length() - 1, -1, -1):
        if size >> level & 1:
            coords.append((level, start >> level))
            start += 1 << level
    return coords


def frontier_indexes(size: int) -> list[int]:
    """The stored indexes of the frontier of ``size`` (see :func:`frontier_coordinates`)."""
    return [stored_hash_index(level, index) for level, index in frontier_coordinates(size)]


# -- appending --------------------------------------------------------------------------------


def append_leaf(
    frontier: Sequence[bytes], size: int, leaf: bytes
) -> tuple[tuple[bytes, ...], list[bytes]]:
    """Add one leaf hash to the tree of ``size`` whose frontier is ``frontier``.

    Returns (the frontier of ``size + 1``, the hashes to store at indexes
    ``stored_hash_count(size)`` onward: the leaf, then each subtree it completes)."""
    compact = CompactRange(size, frontier)
    new = compact.append(leaf)
    return compact.frontier(), new


def append_leaves(
    frontier: Sequence[bytes], size: int, leaves: Iterable[bytes]
) -> tuple[tuple[bytes, ...], list[bytes]]:
    """:func:`append_leaf` for each of ``leaves``; returns the last frontier and every new
    stored hash, in stored order."""
    current = tuple(frontier)
    stored: list[bytes] = []
    for leaf in leaves:
        current, new = append_leaf(current, size, leaf)
        stored.extend(new)
        size += 1
    return current, stored


class CompactRange:
    """A frontier kept in place for appending many leaves fast (the writer's hot path):
    ``size`` leaves, ``hashes`` the frontier, ``stored`` the count of stored hashes so far
    (the index the next stored hash gets)."""

    __slots__ = ("hashes", "size", "stored")

    def __init__(self, size: int = 0, frontier: Sequence[bytes] = ()) -> None:
        assert len(frontier) == size.bit_count(), "bad math: frontier does not match the size"
        self.size = size
        self.hashes = list(frontier)
        self.stored = stored_hash_count(size)

    def append(self, leaf: bytes) -> list[bytes]:
        """Add a leaf hash; return the hashes to store, at indexes ``stored - len(result)``
        onward (as :func:`append_leaf`)."""
        stack = self.hashes
        new = [leaf]
        current = leaf
        n = self.size
        sha256 = hashlib.sha256
        while n & 1:
            current = sha256(_NODE + stack.pop() + current).digest()
            new.append(current)
            n >>= 1
        stack.append(current)
        self.size += 1
        self.stored += len(new)
        return new

    def append_into(self, leaf: bytes, out: list[bytes]) -> None:
        """:meth:`append`, adding the new stored hashes to ``out`` (no list per leaf: this
        runs for every event written)."""
        stack = self.hashes
        out.append(leaf)
        current = leaf
        n = self.size
        added = 1
        sha256 = hashlib.sha256
        while n & 1:
            current = sha256(_NODE + stack.pop() + current).digest()
            out.append(current)
            added += 1
            n >>= 1
        stack.append(current)
        self.size += 1
        self.stored += added

    def extend(self, leaves: Iterable[bytes], out: list[bytes]) -> None:
        """Add each of ``leaves`` (leaf hashes: :func:`leaf_hash` of each record), adding
        every new stored hash to ``out`` in stored order. One tight loop, every callee bound
        once: the writer runs it for every event it commits."""
        stack = self.hashes
        pop = stack.pop
        push = stack.append
        append = out.append
        n = self.size
        sha256 = hashlib.sha256
        node = _NODE
        start = len(out)
        for current in leaves:
            append(current)
            m = n
            while m & 1:
                current = sha256(node + pop() + current).digest()
                append(current)
                m >>= 1
            push(current)
            n += 1
        self.size = n
        self.stored += len(out) - start

    def extend_groups(self, leaves: Iterable[bytes], out: list[bytes]) -> None:
        """:meth:`extend`, but adding one item per leaf to ``out``: the group of hashes
        that leaf stores (its own hash, then each subtree it completes: see
        :func:`stored_hash_leaf`), concatenated. For a store that keeps each group beside
        its event (no row or index entry of its own).

        The leaves come hashed (the writer hashes each while it seals the event, with its
        canonical bytes at hand), and every callee is bound to a local: under the GIL, inside
        every commit, the lookups were a third of this loop's time beside its SHA-256 calls."""
        stack = self.hashes
        pop = stack.pop
        push = stack.append
        append = out.append
        n = self.size
        sha256 = hashlib.sha256
        node = _NODE
        added = 0
        for current in leaves:
            if n & 1:  # completes at least one subtree: the leaf's hash, then each node
                group = current
                m = n
                while m & 1:
                    current = sha256(node + pop() + current).digest()
                    group += current
                    added += 1
                    m >>= 1
                append(group)
            else:
                append(current)
            push(current)
            n += 1
        self.stored += added + n - self.size
        self.size = n

    def frontier(self) -> tuple[bytes, ...]:
        return tuple(self.hashes)


def extend_canonical_py(
    frontier: Sequence[bytes], size: int, canonical: Sequence[bytes], grouped: bool
) -> tuple[list[bytes], tuple[bytes, ...]]:
    """Add a leaf for each of ``canonical`` (events' canonical bytes, in seq order) to the
    tree of ``size`` whose frontier is ``frontier``; returns (the new stored hashes: one
    group per event when ``grouped``, as :meth:`CompactRange.extend_groups`, else each on its
    own, as :meth:`CompactRange.extend`; the new frontier). Raises ``ValueError`` for a
    frontier that does not match the size, ``TypeError`` for an item that is not bytes.

    The reference for :func:`extend_canonical`'s C version (hub/core/_treehash.c), which
    must agree with this one on every input (tests/hub/core/test_treehash.py)."""
    if size < 0:
        raise ValueError("a tree size is not negative")
    if len(frontier) != size.bit_count():
        raise ValueError("the frontier does not match the size")
    if any(not isinstance(h, bytes) or len(h) != HASH_SIZE for h in frontier):
        raise ValueError("a frontier hash is not 32 bytes")
    if any(not isinstance(c, bytes) for c in canonical):
        raise TypeError("canonical bytes must be bytes")
    compact = CompactRange(size, frontier)
    leaves = [leaf_hash(c) for c in canonical]
    out: list[bytes] = []
    if grouped:
        compact.extend_groups(leaves, out)
    else:
        compact.extend(leaves, out)
    return out, compact.frontier()


def extend_canonical(
    frontier: Sequence[bytes], size: int, canonical: Sequence[bytes], grouped: bool
) -> tuple[list[bytes], tuple[bytes, ...]]:
    """:func:`extend_canonical_py`, in C where hub/core/_treehash.c was built (one call
    per workspace and batch; the GIL released while it hashes a large input): what the
    writer runs for every event it commits."""
    if _extend_c is not None:
        return _extend_c(frontier, size, canonical, grouped)
    return extend_canonical_py(frontier, size, canonical, grouped)


def accelerated() -> bool:
    """Whether :func:`extend_canonical` runs in C here (bench/log_bench.py says; the tests)."""
    return _extend_c is not None


def frontier_root(frontier: Sequence[bytes]) -> bytes:
    """The root hash of the tree a frontier tiles (RFC 9162 MTH): fold right to left."""
    if not frontier:
        return EMPTY_ROOT
    root = frontier[-1]
    for h in reversed(frontier[:-1]):
        root = node_hash(h, root)
    return root


# -- ranges: every hash the RFC's recursions need is a fold of stored perfect subtrees --------


def _range_coordinates(lo: int, hi: int) -> list[tuple[int, int]]:
    """The perfect subtrees tiling leaves ``[lo, hi)``, left to right. Every range RFC 9162's
    MTH/PATH/PROOF recursions visit starts at a multiple of a power of two at least its
    length, so the greedy tiling is exactly the RFC's split, and folding it right to left
    gives MTH(D[lo:hi])."""
    assert 0 <= lo < hi, "bad math: empty range"
    coords: list[tuple[int, int]] = []
    while lo < hi:
        level = (hi - lo).bit_length() - 1
        while lo & ((1 << level) - 1):
            level -= 1
        coords.append((level, lo >> level))
        lo += 1 << level
    return coords


def _range_indexes(lo: int, hi: int) -> list[int]:
    return [stored_hash_index(level, index) for level, index in _range_coordinates(lo, hi)]


def _fold(hashes: Sequence[bytes]) -> bytes:
    assert hashes, "bad math: folding nothing"
    root = hashes[-1]
    for h in reversed(hashes[:-1]):
        root = node_hash(h, root)
    return root


def _range_hash(lo: int, hi: int, reader: HashReader) -> bytes:
    indexes = _range_indexes(lo, hi)
    hashes = reader.read_hashes(indexes)
    assert len(hashes) == len(indexes), "bad math: reader returned the wrong count"
    return _fold(hashes)


def tree_hash_indexes(size: int) -> list[int]:
    """The stored indexes :func:`tree_hash` reads."""
    return frontier_indexes(size)


def tree_hash(size: int, reader: HashReader) -> bytes:
    """The root hash of the tree of ``size`` leaves (RFC 9162 §2.1.1)."""
    if size == 0:
        return EMPTY_ROOT
    return _range_hash(0, size, reader)


def _inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """The leaf ranges whose MTH make up PATH(index, D[0:size]) (RFC 9162 §2.1.3.1),
    deepest first."""
    ranges: list[tuple[int, int]] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            ranges.append((lo + k, hi))
            hi = lo + k
        else:
            ranges.append((lo, lo + k))
            lo = lo + k
    ranges.reverse()
    return ranges


def _consistency_ranges(old: int, new: int) -> list[tuple[int, int]]:
    """The leaf ranges whose MTH make up PROOF(old, D[0:new]) (RFC 9162 §2.1.4.1),
    deepest first."""
    ranges: list[tuple[int, int]] = []
    lo, hi, m, complete = 0, new, old, True
    while m != hi - lo:
        k = _split(hi - lo)
        if m <= k:
            ranges.append((lo + k, hi))
            hi = lo + k
        else:
            ranges.append((lo, lo + k))
            lo, m, complete = lo + k, m - k, False
    if not complete:
        ranges.append((lo, hi))
    ranges.reverse()
    return ranges


def _check_inclusion_args(index: int, size: int) -> None:
    if not 0 <= index < size:
        raise ProofError(f"leaf {index} is not in a tree of size {size}", index=index, size=size)


def _check_consistency_args(old: int, new: int) -> None:
    if not 0 <= old <= new:
        raise ProofError(f"no consistency proof from size {old} to size {new}", old=old, new=new)


def inclusion_proof_indexes(index: int, size: int) -> list[int]:
    """The stored indexes :func:`inclusion_proof` reads."""
    _check_inclusion_args(index, size)
    return [i for lo, hi in _inclusion_ranges(index, size) for i in _range_indexes(lo, hi)]


def inclusion_proof(index: int, size: int, reader: HashReader) -> list[bytes]:
    """PATH(index, D[0:size]) (RFC 9162 §2.1.3.1): the audit path of leaf ``index``
    (0-based) in the tree of ``size``. Raises :class:`ProofError` when the leaf is not in it."""
    _check_inclusion_args(index, size)
    return [_range_hash(lo, hi, reader) for lo, hi in _inclusion_ranges(index, size)]


def consistency_proof_indexes(old: int, new: int) -> list[int]:
    """The stored indexes :func:`consistency_proof` reads."""
    _check_consistency_args(old, new)
    if old == 0 or old == new:
        return []
    return [i for lo, hi in _consistency_ranges(old, new) for i in _range_indexes(lo, hi)]


def consistency_proof(old: int, new: int, reader: HashReader) -> list[bytes]:
    """PROOF(old, D[0:new]) (RFC 9162 §2.1.4.1): proves the tree of ``old`` leaves is a
    prefix of the tree of ``new``. Empty when ``old`` is 0 or equals ``new``. Raises
    :class:`ProofError` when ``old > new``."""
    _check_consistency_args(old, new)
    if old == 0 or old == new:
        return []
    return [_range_hash(lo, hi, reader) for lo, hi in _consistency_ranges(old, new)]


# -- checking -----------------------------------------------------------------------------------
# Written from the recursive definitions (§2.1.3.1, §2.1.4.1), walking the proof from its last
# (topmost) element down; the tests check them against the RFC's iterative verification
# algorithms (§2.1.3.2, §2.1.4.2), implemented independently.


def _check_hash(value: bytes, what: str) -> None:
    if not isinstance(value, bytes) or len(value) != HASH_SIZE:
        raise ProofError(f"{what} is not a {HASH_SIZE}-byte hash")


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root an inclusion proof leads to from ``leaf``. Raises :class:`ProofError` for a
    proof of the wrong length or a leaf outside the tree."""
    _check_inclusion_args(index, size)
    _check_hash(leaf, "the leaf hash")
    for h in proof:
        _check_hash(h, "a proof element")
    # The siblings from the top down; the proof lists them deepest first.
    path: list[tuple[bool, bytes]] = []  # (sibling is on the right, sibling)
    lo, hi = 0, size
    remaining = len(proof)
    while hi - lo > 1:
        if remaining == 0:
            raise ProofError("the inclusion proof is too short", length=len(proof))
        remaining -= 1
        sibling = proof[remaining]
        k = _split(hi - lo)
        if index < lo + k:
            path.append((True, sibling))
            hi = lo + k
        else:
            path.append((False, sibling))
            lo = lo + k
    if remaining:
        raise ProofError("the inclusion proof is too long", length=len(proof))
    h = leaf
    for on_right, sibling in reversed(path):
        h = node_hash(h, sibling) if on_right else node_hash(sibling, h)
    return h


def check_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes
) -> None:
    """Check that ``leaf`` is leaf ``index`` of the tree of ``size`` whose root is ``root``.
    Raises :class:`ProofError` otherwise."""
    _check_hash(root, "the root hash")
    if root_from_inclusion(index, size, leaf, proof) != root:
        raise ProofError(
            f"leaf {index} is not in the tree of size {size} with that root",
            index=index,
            size=size,
        )


def check_consistency(
    old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """Check that the tree of ``old`` leaves with ``old_root`` is a prefix of the tree of
    ``new`` leaves with ``new_root``. Raises :class:`ProofError` otherwise."""
    _check_consistency_args(old, new)
    _check_hash(old_root, "the old root hash")
    _check_hash(new_root, "the new root hash")
    for h in proof:
        _check_hash(h, "a proof element")
    if old == 0:
        if proof:
            raise ProofError("a proof from the empty tree must be empty")
        if old_root != EMPTY_ROOT:
            raise ProofError("the empty tree has another root", old=old, new=new)
        return
    if old == new:
        if proof:
            raise ProofError("a proof between equal sizes must be empty")
        if old_root != new_root:
            raise ProofError(f"two different roots for the tree of size {old}", old=old, new=new)
        return
    # Top down: which side each proof element is on, and whether it is part of the old tree.
    steps: list[tuple[bool, bytes]] = []  # (the old tree ends left of this sibling, sibling)
    lo, hi, m, complete = 0, new, old, True
    remaining = len(proof)

    def take() -> bytes:
        nonlocal remaining
        if remaining == 0:
            raise ProofError("the consistency proof is too short", length=len(proof))
        remaining -= 1
        return proof[remaining]

    while m != hi - lo:
        k = _split(hi - lo)
        sibling = take()
        if m <= k:
            steps.append((True, sibling))
            hi = lo + k
        else:
            steps.append((False, sibling))
            lo, m, complete = lo + k, m - k, False
    # The bottom: the old tree's last perfect subtree; given by the proof unless the old tree
    # is itself a leftmost perfect subtree of the new one (then it is old_root).
    seed = old_root if complete else take()
    if remaining:
        raise ProofError("the consistency proof is too long", length=len(proof))
    old_hash = new_hash = seed
    for old_ends_left, sibling in reversed(steps):
        if old_ends_left:
            new_hash = node_hash(new_hash, sibling)
        else:
            old_hash = node_hash(sibling, old_hash)
            new_hash = node_hash(sibling, new_hash)
    if old_hash != old_root:
        raise ProofError(
            f"the tree of size {old} is not a prefix of the tree of size {new}: the proof "
            "does not lead to the old root",
            old=old,
            new=new,
        )
    if new_hash != new_root:
        raise ProofError(
            f"the tree of size {old} is not a prefix of the tree of size {new}: the proof "
            "does not lead to the new root",
            old=old,
            new=new,
        )


__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "LEAF_PREFIX",
    "CompactRange",
    "HashReader",
    "MappingReader",
    "ProofError",
    "append_leaf",
    "append_leaves",
    "check_consistency",
    "check_inclusion",
    "consistency_proof",
    "consistency_proof_indexes",
    "frontier_coordinates",
    "frontier_indexes",
    "frontier_root",
    "group_size",
    "inclusion_proof",
    "inclusion_proof_indexes",
    "leaf_hash",
    "node_hash",
    "root_from_inclusion",
    "stored_hash_count",
    "stored_hash_index",
    "stored_hash_leaf",
    "tree_hash",
    "tree_hash_indexes",
]
