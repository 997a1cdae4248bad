"""The Docker engine behind the ``container`` backend: connecting, probing, the owner label,
and the one mapping of docker SDK errors to execution errors.

The ``docker`` SDK is imported here and in :mod:`backends.container.backend` only (lazily, so
importing the package does not need it); nothing above the backend touches the engine.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from backends.container.images import ImageBuildError
from hub.core.execution.errors import (
    BackendUnavailable,
    ExecutionError,
    ExecutionFailed,
    SandboxError,
)

__all__ = ["connect_engine", "engine_reachable", "map_engine_error", "owner_label", "probe_image"]


def owner_label(data_dir: Path) -> str:
    """The ``agora.owner`` label of a hub's containers: one per data directory, so a hub
    sweeps only what it (or its crashed predecessor) left, never another hub's containers."""
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()
    return f"agora-{digest[:12]}"


def engine_reachable(base_url: str | None = None, timeout_s: float = 5.0) -> tuple[bool, str]:
    """Whether a Docker engine answers at ``base_url`` (default: the environment's). Blocking:
    for command-line tools and test set-up, not for the event loop."""
    try:
        client = connect_engine(base_url, timeout_s, 2)
    except ExecutionError as e:
        return False, e.message
    client.close()
    return True, ""


def connect_engine(base_url: str | None, timeout_s: float, pool_size: int) -> Any:
    """A connected ``docker.DockerClient`` (API version negotiated). Blocking. Raises
    :class:`BackendUnavailable`."""
    import docker
    import docker.errors

    try:
        if base_url:
            client = docker.DockerClient(
                base_url=base_url, version="auto", timeout=timeout_s, max_pool_size=pool_size
            )
        else:
            client = docker.from_env(timeout=timeout_s, max_pool_size=pool_size)
        client.ping()
    except Exception as e:  # the SDK raises DockerException, requests' and socket errors
        raise BackendUnavailable(
            f"the Docker engine is not reachable ({base_url or 'DOCKER_HOST/default socket'}): {e}",
            backend="container",
        ) from e
    return client


def map_engine_error(error: Exception, what: str) -> ExecutionError:
    """The one place docker SDK errors become execution errors."""
    import docker.errors
    import requests.exceptions

    if isinstance(error, ExecutionError):
        return error
    if isinstance(error, ImageBuildError):
        return BackendUnavailable(f"{what}: {error}")
    if isinstance(error, docker.errors.ImageNotFound):
        return BackendUnavailable(
            f"{what}: image not found — build it with `agora images build` ({error})"
        )
    if isinstance(error, requests.exceptions.ConnectionError | ConnectionError):
        return BackendUnavailable(f"{what}: the Docker engine is not reachable ({error})")
    if isinstance(error, docker.errors.APIError):
        return SandboxError(f"{what}: the Docker engine refused: {error.explanation or error}")
    return ExecutionFailed(f"{what}: {error!r}")


def probe_image(base_url: str | None, image: str, *, auto_build: bool) -> tuple[bool, str]:
    """Whether the engine answers and has ``image`` (or will build it at start:
    ``auto_build``), without side effects on running hubs: nothing is swept or started.
    Blocking."""
    import docker.errors

    try:
        client = connect_engine(base_url, 5.0, 2)
    except ExecutionError as e:
        return False, e.message
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        if auto_build:
            return True, ""  # built at the hub's first start
        return False, f"image {image} is missing: run `agora images build`"
    except Exception as e:
        return False, f"the Docker engine refused: {e}"
    finally:
        client.close()
    return True, ""
