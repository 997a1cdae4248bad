"""The ``container`` backend: one fresh Docker container per execution.

:mod:`~backends.container.backend` (the :class:`ContainerBackend`: runs, warm pool, sweep),
:mod:`~backends.container.spec` (what a container is made of, from the request: pure),
:mod:`~backends.container.mounts` (the workspace as bind mounts),
:mod:`~backends.container.attach` (stdio over the attach socket),
:mod:`~backends.container.engine` (the Docker engine: connecting, probing, the owner label,
error mapping), :mod:`~backends.container.images` (the local busybox image).
"""

from backends.container.backend import ContainerBackend
from backends.container.engine import connect_engine, engine_reachable, owner_label, probe_image
from backends.container.images import DEFAULT_IMAGE
from backends.container.spec import (
    DEFAULT_CONTAINER_POLICY,
    LAUNCHER,
    container_config,
    warm_prelude,
)

__all__ = [
    "DEFAULT_CONTAINER_POLICY",
    "DEFAULT_IMAGE",
    "LAUNCHER",
    "ContainerBackend",
    "connect_engine",
    "container_config",
    "engine_reachable",
    "owner_label",
    "probe_image",
    "warm_prelude",
]
