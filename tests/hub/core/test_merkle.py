"""hub.core.merkle against Certificate Transparency's published test vectors and against an
independent implementation of RFC 9162 §2.1 (rfc9162_reference, no code shared with hub),
on random trees."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.core import merkle
from hub.core.merkle import (
    EMPTY_ROOT,
    MappingReader,
    ProofError,
    append_leaf,
    append_leaves,
    check_consistency,
    check_inclusion,
    consistency_proof,
    consistency_proof_indexes,
    frontier_indexes,
    frontier_root,
    inclusion_proof,
    inclusion_proof_indexes,
    leaf_hash,
    root_from_inclusion,
    stored_hash_count,
    stored_hash_index,
    tree_hash,
)

from . import rfc9162_reference as ref

# The test data of Certificate Transparency's Merkle tree implementation (RFC 6962; the same
# vectors golang.org/x/mod/sumdb/tlog checks against): eight leaf inputs, the root of every
# prefix, and a few proofs.
LEAVES = [
    bytes.fromhex(x)
    for x in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]
ROOTS = [
    bytes.fromhex(x)
    for x in (
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    )
]
EMPTY = bytes.fromhex("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
INCLUSION_5_OF_8 = [
    bytes.fromhex(x)
    for x in (
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    )
]
CONSISTENCY_6_8 = [
    bytes.fromhex(x)
    for x in (
        "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    )
]
CONSISTENCY_2_5 = [
    bytes.fromhex(x)
    for x in (
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
    )
]


def stored(data: list[bytes]) -> tuple[tuple[bytes, ...], MappingReader]:
    """The frontier and a reader over every stored hash of the tree of ``data``."""
    frontier, hashes = append_leaves((), 0, [leaf_hash(d) for d in data])
    return frontier, MappingReader(dict(enumerate(hashes)))


# -- published vectors ------------------------------------------------------------------------


def test_roots_of_the_ct_vectors() -> None:
    assert EMPTY_ROOT == EMPTY
    frontier: tuple[bytes, ...] = ()
    for n, data in enumerate(LEAVES):
        frontier, _ = append_leaf(frontier, n, leaf_hash(data))
        assert frontier_root(frontier) == ROOTS[n]
    _, reader = stored(LEAVES)
    assert [tree_hash(n, reader) for n in range(1, 9)] == ROOTS
    assert tree_hash(0, reader) == EMPTY


def test_proofs_of_the_ct_vectors() -> None:
    _, reader = stored(LEAVES)
    assert inclusion_proof(5, 8, reader) == INCLUSION_5_OF_8
    check_inclusion(5, 8, leaf_hash(LEAVES[5]), INCLUSION_5_OF_8, ROOTS[7])
    assert inclusion_proof(2, 3, reader) == [ROOTS[1]]
    assert consistency_proof(6, 8, reader) == CONSISTENCY_6_8
    check_consistency(6, 8, ROOTS[5], ROOTS[7], CONSISTENCY_6_8)
    assert consistency_proof(2, 5, reader) == CONSISTENCY_2_5
    check_consistency(2, 5, ROOTS[1], ROOTS[4], CONSISTENCY_2_5)


def test_bad_proofs_of_the_ct_vectors_are_refused() -> None:
    with pytest.raises(ProofError):
        check_inclusion(4, 8, leaf_hash(LEAVES[5]), INCLUSION_5_OF_8, ROOTS[7])
    with pytest.raises(ProofError):
        check_inclusion(5, 8, leaf_hash(LEAVES[5]), INCLUSION_5_OF_8[:-1], ROOTS[7])
    with pytest.raises(ProofError):
        check_inclusion(5, 8, leaf_hash(LEAVES[5]), [*INCLUSION_5_OF_8, EMPTY], ROOTS[7])
    with pytest.raises(ProofError):
        check_consistency(6, 8, ROOTS[4], ROOTS[7], CONSISTENCY_6_8)
    with pytest.raises(ProofError):
        check_consistency(6, 8, ROOTS[5], ROOTS[6], CONSISTENCY_6_8)
    with pytest.raises(ProofError):
        check_consistency(6, 8, ROOTS[5], ROOTS[7], CONSISTENCY_6_8[1:])
    with pytest.raises(ProofError):
        check_consistency(8, 6, ROOTS[7], ROOTS[5], [])
    with pytest.raises(ProofError):
        check_consistency(3, 3, ROOTS[2], ROOTS[3], [])
    with pytest.raises(ProofError):
        check_inclusion(8, 8, leaf_hash(LEAVES[0]), [], ROOTS[7])


# -- the stored hash index (sumdb/tlog's layout) ----------------------------------------------


def test_stored_hash_index_is_dense_and_in_append_order() -> None:
    # Leaf n stores its hash, then one per subtree it completes: the index of each is the
    # running count, level by level.
    count = 0
    for n in range(300):
        assert stored_hash_index(0, n) == count
        count += 1
        level, index = 0, n
        while index & 1:
            level, index = level + 1, index >> 1
            assert stored_hash_index(level, index) == count
            count += 1
        assert stored_hash_count(n + 1) == count
    assert stored_hash_count(0) == 0


def test_stored_hash_leaf_inverts_the_index_into_leaf_groups() -> None:
    # Every stored hash belongs to the group of the leaf whose append stored it, at the
    # offset of its level; the groups tile the sequence in order.
    index = 0
    for n in range(600):
        assert merkle.group_size(n) == 1 + (n ^ (n + 1)).bit_length() - 1
        for level in range(merkle.group_size(n)):
            assert stored_hash_index(level, ((n + 1) >> level) - 1) == index
            assert merkle.stored_hash_leaf(index) == (n, level)
            index += 1
    assert merkle.stored_hash_leaf(2**40 + 5)[0] < 2**40


@given(data=st.lists(st.binary(max_size=8), max_size=70), cut=st.integers(0, 70))
def test_extend_groups_stores_the_same_hashes_per_leaf(data: list[bytes], cut: int) -> None:
    leaves = [leaf_hash(d) for d in data]
    flat: list[bytes] = []
    merkle.CompactRange().extend(leaves, flat)
    assert flat == append_leaves((), 0, leaves)[1]  # the one-leaf-at-a-time reference
    first = merkle.CompactRange()
    groups: list[bytes] = []
    first.extend_groups(leaves[:cut], groups)
    second = merkle.CompactRange(first.size, first.frontier())  # as the next batch
    second.extend_groups(leaves[cut:], groups)
    assert second.frontier() == append_leaves((), 0, leaves)[0]
    assert b"".join(groups) == b"".join(flat)
    assert [len(g) // 32 for g in groups] == [merkle.group_size(n) for n in range(len(data))]
    assert second.stored == len(flat) == stored_hash_count(len(data))


def test_at_most_log_n_hashes_per_append_and_under_two_on_average() -> None:
    frontier: tuple[bytes, ...] = ()
    total = 0
    for n in range(4096):
        frontier, new = append_leaf(frontier, n, leaf_hash(n.to_bytes(4, "big")))
        assert len(new) <= 1 + n.bit_length()
        assert len(frontier) == (n + 1).bit_count()
        total += len(new)
    assert total / 4096 < 2


def test_frontier_indexes_name_the_stored_frontier() -> None:
    data = [bytes([i]) for i in range(37)]
    _, reader = stored(data)
    for n in range(38):
        frontier, _ = append_leaves((), 0, [leaf_hash(d) for d in data[:n]])
        assert tuple(reader.read_hashes(frontier_indexes(n))) == frontier


def test_bad_math_is_an_assertion() -> None:
    with pytest.raises(AssertionError):
        append_leaf((), 3, EMPTY)  # a frontier of size 3 has two hashes
    with pytest.raises(AssertionError):
        stored_hash_index(-1, 0)


# -- against the independent RFC 9162 reference, on random trees --------------------------------

trees = st.lists(st.binary(max_size=8), min_size=1, max_size=70)


@settings(max_examples=150, deadline=None)
@given(data=trees, pick=st.data())
def test_roots_and_inclusion_proofs_match_the_reference(
    data: list[bytes], pick: st.DataObject
) -> None:
    _, reader = stored(data)
    size = pick.draw(st.integers(1, len(data)), label="size")
    index = pick.draw(st.integers(0, size - 1), label="index")
    root = tree_hash(size, reader)
    assert root == ref.mth(data[:size])
    ours = inclusion_proof(index, size, reader)
    assert ours == ref.path(index, data[:size])
    leaf = leaf_hash(data[index])
    ref.verify_inclusion(index, size, leaf, ours, root)  # the RFC's algorithm accepts ours
    check_inclusion(index, size, leaf, ours, root)
    assert root_from_inclusion(index, size, leaf, ours) == root
    assert len(inclusion_proof_indexes(index, size)) >= len(ours)


@settings(max_examples=150, deadline=None)
@given(data=trees, pick=st.data())
def test_consistency_proofs_match_the_reference(data: list[bytes], pick: st.DataObject) -> None:
    _, reader = stored(data)
    new = pick.draw(st.integers(1, len(data)), label="new")
    old = pick.draw(st.integers(0, new), label="old")
    ours = consistency_proof(old, new, reader)
    old_root, new_root = tree_hash(old, reader), tree_hash(new, reader)
    check_consistency(old, new, old_root, new_root, ours)
    assert len(consistency_proof_indexes(old, new)) >= len(ours)
    if 0 < old < new:
        assert ours == ref.proof(old, data[:new])
        ref.verify_consistency(old, new, old_root, new_root, ours)
    else:
        assert ours == []


@settings(max_examples=150, deadline=None)
@given(data=trees, pick=st.data())
def test_a_tampered_proof_fails_in_both_implementations(
    data: list[bytes], pick: st.DataObject
) -> None:
    """Flip one bit of one proof hash (or of the leaf): both the RFC's algorithm and ours
    refuse it."""
    size = len(data)
    if size < 2:
        return
    _, reader = stored(data)
    root = tree_hash(size, reader)
    index = pick.draw(st.integers(0, size - 1), label="index")
    proof = inclusion_proof(index, size, reader)
    at = pick.draw(st.integers(0, len(proof) - 1), label="at")
    bit = pick.draw(st.integers(0, 255), label="bit")
    bad = list(proof)
    bad[at] = bytes(b ^ (1 << (bit % 8)) if i == bit // 8 else b for i, b in enumerate(bad[at]))
    leaf = leaf_hash(data[index])
    with pytest.raises(ref.ReferenceError):
        ref.verify_inclusion(index, size, leaf, bad, root)
    with pytest.raises(ProofError):
        check_inclusion(index, size, leaf, bad, root)
    old = pick.draw(st.integers(1, size - 1), label="old")
    cproof = consistency_proof(old, size, reader)
    old_root = tree_hash(old, reader)
    at = pick.draw(st.integers(0, len(cproof) - 1), label="cat")
    cbad = list(cproof)
    cbad[at] = bytes(b ^ 1 if i == 0 else b for i, b in enumerate(cbad[at]))
    with pytest.raises(ref.ReferenceError):
        ref.verify_consistency(old, size, old_root, root, cbad)
    with pytest.raises(ProofError):
        check_consistency(old, size, old_root, root, cbad)


@settings(max_examples=100, deadline=None)
@given(data=trees, other=st.binary(max_size=8), pick=st.data())
def test_a_changed_leaf_breaks_consistency_with_the_old_root(
    data: list[bytes], other: bytes, pick: st.DataObject
) -> None:
    """A history with one leaf replaced is not consistent with the original's root: the
    checkpoint-level property ``agora verify --checkpoint`` relies on."""
    size = len(data)
    at = pick.draw(st.integers(0, size - 1), label="at")
    if data[at] == other:
        return
    forged = [*data[:at], other, *data[at + 1 :]]
    _, reader = stored(data)
    _, forged_reader = stored(forged)
    assert tree_hash(size, forged_reader) != tree_hash(size, reader)
    new = size + 1
    grown = [*forged, b"next"]
    _, grown_reader = stored(grown)
    with pytest.raises(ProofError):
        check_consistency(
            size,
            new,
            tree_hash(size, reader),
            tree_hash(new, grown_reader),
            consistency_proof(size, new, grown_reader),
        )


def test_module_exports() -> None:
    assert set(merkle.__all__) <= set(dir(merkle))
