"""The audit ops of the wire (``checkpoint``, ``proof``, ``cosign``; docs/protocol.md,
"Audit"), over the hub's :class:`hub.checkpoints.Checkpointer`.

The session (:mod:`hub.core.wire.session`) decoded the frame, checked the rights and the
sizes; this carries the request out against the store. Errors come from the one table:
``notFound`` for a workspace without events or a size beyond its tree, ``badRequest`` for a
cosignature that is not a valid witness signature of a checkpoint kept here.
"""

from __future__ import annotations

from hub.checkpoints import Checkpointer
from hub.core.checkpoint import COSIGNATURE_V1, CheckpointRecord, parse_verifier_key
from hub.core.errors import BadRequest
from hub.core.wire.session import CheckpointRequest, CosignRequest, ProofRequest

__all__ = ["AuditOps"]


class AuditOps:
    """Answers the audit requests of every connection of one hub."""

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer

    async def answer(
        self, request: CheckpointRequest | ProofRequest | CosignRequest
    ) -> CheckpointRecord | tuple[bytes, ...]:
        match request:
            case CheckpointRequest(workspace=workspace):
                # The latest kept, or a new one when the head moved past it (on_demand returns
                # the kept one when it already covers the whole log).
                return await self.checkpointer.on_demand(workspace)
            case ProofRequest(workspace=workspace, seq=seq, old=old, new=new):
                if seq is not None:
                    inclusion = await self.checkpointer.inclusion_proof(workspace, seq, new)
                    return inclusion.hashes
                consistency = await self.checkpointer.consistency_proof(workspace, old, new)
                return consistency.hashes
            case CosignRequest(workspace=workspace, note=note, key=key):
                witness = parse_verifier_key(key)
                if witness.sig_type != COSIGNATURE_V1:
                    raise BadRequest(
                        "a witness key is a cosignature/v1 key (type 0x04)", field="$.key"
                    )
                return await self.checkpointer.add_cosignatures(workspace, note, (witness,))
