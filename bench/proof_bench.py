"""Proof benchmark: inclusion and consistency proofs of a workspace of 10^6 events.

    python bench/proof_bench.py [--events N] [--proofs P] [--dir D]

The tree's stored hashes are built directly with the pure functions (hub.core.merkle:
``CompactRange`` over synthetic leaf hashes; no events are written, which would only add
append time) and loaded into a real SQLite store's ``merkle_hashes`` table. Then, through
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
from hub.log.writer import runs

WORKSPACE = "bench"
INSERT = "INSERT INTO merkle_hashes VALUES (?, ?, ?)"
TARGET_MS = 5.0  # per proof, generation through the store


def leaf(i: int) -> bytes:
    return leaf_hash(i.to_bytes(8, "big"))


def build(db: Path, n: int) -> bytes:
    """Store the hashes of the tree of ``n`` synthetic leaves; return its root."""
    compact = CompactRange()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    hashes: list[bytes] = []
    first = 0
    for i in range(n):
        compact.append_into(leaf(i), hashes)
        if len(hashes) >= 100_000:  # stored as the writer stores them: runs of RUN_MAX
            conn.executemany(
                "INSERT INTO merkle_hashes VALUES (?, ?, ?)", runs(WORKSPACE, first, hashes)
            )
            first = compact.stored
            hashes = []
    conn.executemany(INSERT, runs(WORKSPACE, first, hashes))
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
    parser.add_argument("--dir", type=Path, default=None, help="where the database goes")
    args = parser.parse_args(argv)
    root_dir = Path(tempfile.mkdtemp(prefix="proof-bench-", dir=args.dir))
    try:
        db = root_dir / "agora.db"
        asyncio.run(_create(db))
        t0 = time.perf_counter()
        root = build(db, args.events)
        built = time.perf_counter() - t0
        conn = sqlite3.connect(db)
        rows, size = conn.execute(
            "SELECT count(*), sum(length(hash)) / 32 FROM merkle_hashes"
        ).fetchone()
        conn.close()
        print(
            f"built and stored {size:,} hashes ({rows:,} runs) for {args.events:,} leaves in "
            f"{built:.1f} s ({size / args.events:.2f} per leaf); root "
            f"{base64.b64encode(root).decode()}"
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
