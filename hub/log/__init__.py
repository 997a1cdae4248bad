"""Log stores: the durable append-only log of events, its blobs and its snapshots."""

from hub.core.records import AppendResult, Head, Snapshot, VerifyReport
from hub.log.base import BlobStore, EventStore

__all__ = ["AppendResult", "BlobStore", "EventStore", "Head", "Snapshot", "VerifyReport"]
