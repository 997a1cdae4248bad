"""Proof benchmark: inclusion and consistency proofs of a workspace of 10^6 events.

    python bench/proof_bench.py [--events N] [--proofs P] [--dir D]

The tree's stored hashes are built directly with the pure functions (hub.core.merkle:
``CompactRange`` over synthetic leaf hashes; the events are not sealed, which would only add
append time) and loaded into a real SQLite store as it keeps them: each leaf's group of
stored hashes in its event's row (``events.tree``), beside a stand-in body of
``--body-bytes`` (default 400, about a message event's) so that the rows, and the pages a
proof reads, are the size of a real log's. Then, through
the store (``read_hashes``, one query per proof) and the pure functions: P inclusion proofs
of random seqs in the tree of N, and P consistency proofs from a random size to N; each
proof is also checked against the tree head. Printed: median and p99 time per proof
(generation = read + assemble; check), proof length in hashes and in bytes (raw and as the
base64 JSON array a client receives). Bounded: building 10^6 events' hashes takes seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hub.core.merkle import (
    CompactRange,
    check_consistency,
    check_inclusion,
    consistency_proof,
    consistency_proof_indexes,
    frontier_root,
    inclusion_proof,
    inclusion_proof_indexes,
    leaf_hash,
    tree_hash,
    tree_hash_indexes,
)
from hub.log.sqlite import SqliteEventStore

WORKSPACE = "bench"
INSERT = (
    "INSERT INTO events (position, workspace, seq, id, kind, timestamp, hash, body, tree) "
    "VALUES (?, ?, ?, ?, 'messagePosted', 0, '', ?, ?)"
)
TARGET_MS = 5.0  # per proof, generation through the store


def leaf(i: int) -> bytes:
    return leaf_hash(i.to_bytes(8, "big"))


def build(db: Path, n: int, body_bytes: int) -> bytes:
    """Store the hashes of the tree of ``n`` synthetic leaves, a group per event row; return
    its root."""
    compact = CompactRange()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    body = b"x" * body_bytes
    page = 100_000
    for start in range(0, n, page):
        groups: list[bytes] = []
        stop = min(start + page, n)
        compact.extend_groups((i.to_bytes(8, "big") for i in range(start, stop)), groups)
        conn.executemany(
            INSERT,
            ((i + 1, WORKSPACE, i + 1, f"e{i}", body, g) for i, g in enumerate(groups, start)),
        )
    conn.commit()
    conn.close()
    return frontier_root(compact.frontier())


def stats(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"median {statistics.median(values) * 1000:.3f} ms, p99 {p99 * 1000:.3f} ms"


async def measure(db: Path, n: int, root: bytes, proofs: int) -> None:
    rng = random.Random(9162)
    async with SqliteEventStore(db) as store:
        reader = await store.read_hashes(WORKSPACE, tree_hash_indexes(n))
        assert tree_hash(n, reader) == root
        gen: list[float] = []
        chk: list[float] = []
        lengths: list[int] = []
        json_sizes: list[int] = []
        for _ in range(proofs):
            index = rng.randrange(n)
            t0 = time.perf_counter()
            reader = await store.read_hashes(WORKSPACE, inclusion_proof_indexes(index, n))
            proof = inclusion_proof(index, n, reader)
            t1 = time.perf_counter()
            check_inclusion(index, n, leaf(index), proof, root)
            t2 = time.perf_counter()
            gen.append(t1 - t0)
            chk.append(t2 - t1)
            lengths.append(len(proof))
            json_sizes.append(len(json.dumps([base64.b64encode(h).decode() for h in proof])))
        print(f"inclusion proof in a tree of {n:,} ({proofs} random seqs)")
        print(f"  generate (store read + assemble): {stats(gen)}")
        print(f"  check: {stats(chk)}")
        print(
            f"  size: {min(lengths)}-{max(lengths)} hashes, {max(lengths) * 32} bytes raw, "
            f"{max(json_sizes)} bytes as a base64 JSON array"
        )
        gen, chk, lengths, json_sizes = [], [], [], []
        roots: dict[int, bytes] = {}
        for _ in range(proofs):
            old = rng.randrange(1, n)
            if old not in roots:
                r = await store.read_hashes(WORKSPACE, tree_hash_indexes(old))
                roots[old] = tree_hash(old, r)
            t0 = time.perf_counter()
            reader = await store.read_hashes(WORKSPACE, consistency_proof_indexes(old, n))
            proof = consistency_proof(old, n, reader)
            t1 = time.perf_counter()
            check_consistency(old, n, roots[old], root, proof)
            t2 = time.perf_counter()
            gen.append(t1 - t0)
            chk.append(t2 - t1)
            lengths.append(len(proof))
            json_sizes.append(len(json.dumps([base64.b64encode(h).decode() for h in proof])))
        print(f"consistency proof to the tree of {n:,} ({proofs} random old sizes)")
        print(f"  generate (store read + assemble): {stats(gen)}")
        print(f"  check: {stats(chk)}")
        print(
            f"  size: {min(lengths)}-{max(lengths)} hashes, {max(lengths) * 32} bytes raw, "
            f"{max(json_sizes)} bytes as a base64 JSON array"
        )
        median_ms = statistics.median(gen) * 1000
        mark = "ok" if median_ms <= TARGET_MS else "MISS"
        print(f"target: median generation <= {TARGET_MS:g} ms per proof: {mark}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--proofs", type=int, default=1000)
    parser.add_argument("--body-bytes", type=int, default=400, help="stand-in body per event")
    parser.add_argument("--dir", type=Path, default=None, help="where the database goes")
    args = parser.parse_args(argv)
    root_dir = Path(tempfile.mkdtemp(prefix="proof-bench-", dir=args.dir))
    try:
        db = root_dir / "agora.db"
        asyncio.run(_create(db))
        t0 = time.perf_counter()
        root = build(db, args.events, args.body_bytes)
        built = time.perf_counter() - t0
        conn = sqlite3.connect(db)
        rows, size = conn.execute("SELECT count(*), sum(length(tree)) / 32 FROM events").fetchone()
        conn.close()
        print(
            f"built and stored {size:,} hashes (in {rows:,} event rows of a {args.body_bytes}-byte "
            f"body) for {args.events:,} leaves in {built:.1f} s ({size / args.events:.2f} per "
            f"leaf); root {base64.b64encode(root).decode()}"
        )
        asyncio.run(measure(db, args.events, root, args.proofs))
    finally:
        shutil.rmtree(root_dir, ignore_errors=True)
    return 0


async def _create(db: Path) -> None:
    async with SqliteEventStore(db):
        pass  # creates the schema


if __name__ == "__main__":
    sys.exit(main())
