"""Log stores: the durable append-only log of events, its blobs and its snapshots."""

from hub.log.base import AppendResult, BlobStore, EventStore, Head, Snapshot, VerifyReport

__all__ = ["AppendResult", "BlobStore", "EventStore", "Head", "Snapshot", "VerifyReport"]
