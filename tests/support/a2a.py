"""The A2A door on a listener of its own, for the tests, the conformance-kit harness and the
A2A benchmark: :func:`a2a_listening` serves an :class:`~a2a_adapter.app.A2AService`'s app on
``hub.http``'s listener (:class:`~hub.http.serve.HttpService`), as ``agora serve`` mounts it
on its one HTTP port. ``a2a_adapter`` has no listener (it may not import ``hub.http``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from starlette.types import ASGIApp

from a2a_adapter.app import A2AService
from hub.http.serve import HttpService


@contextlib.asynccontextmanager
async def a2a_listening(
    service: A2AService, *, wrap: Callable[[ASGIApp], ASGIApp] | None = None
) -> AsyncIterator[A2AService]:
    """``async with a2a_listening(A2AService(..., host=..., port=0)) as a2a``: bind
    ``service.host``/``service.port`` (0: a free one, then in ``a2a.port`` and ``a2a.url``),
    open the door (its card advertises that URL unless ``public_url`` is set) and serve it,
    ``wrap``\\ ped when given. On exit the door closes first (its streams end), then the
    listener, in ``agora serve``'s order. Raises ``OSError`` if the port is taken."""
    http = HttpService(service.host, service.port, shutdown_timeout=service.shutdown_timeout)
    http.bind()
    service.port = http.port
    try:
        app = await service.open_app()
        await http.serve(wrap(app) if wrap is not None else app)
        yield service
    finally:
        try:
            await service.aclose()
        finally:
            await http.aclose()
