"""The owner label of this hub's containers (a container-backend concern, built at the root).

Kept here, beside the composition root that passes it to the backend registry, until the
runtime or the container backend derives it itself (the runtime's owner takes it from here).
"""

from __future__ import annotations

import hashlib

from hub.config import HubConfig

__all__ = ["container_owner"]


def container_owner(config: HubConfig) -> str:
    """The ``agora.owner`` label of this hub's containers: one per data directory, so a hub
    sweeps only what it (or its crashed predecessor) left, never another hub's containers."""
    digest = hashlib.sha256(str(config.storage.data_dir.resolve()).encode()).hexdigest()
    return f"agora-{digest[:12]}"
