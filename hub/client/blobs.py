"""Blob transfers of the Python client: ``putBlob``/``blobChunk``/``commitBlob`` and ranged
``getBlob`` over the session (docs/protocol.md, "Blobs").

An upload sends up to :data:`WINDOW` chunks before waiting for their replies; each is an
idempotent request that the session sends again after a reconnect, and a chunk the hub
refuses for a gap (it lost some after a drop) makes the upload ask ``putBlob`` again and
resume at the offset the hub holds. A download keeps :data:`WINDOW` ranged ``getBlob``
requests in flight and yields their bytes in order. Content comes from, and goes to, bytes,
a path or an async byte stream; a stream of unknown length is spooled to a temporary file
while it is hashed (the hub needs the size and sha256 before the first chunk). Neither side
ever holds more than a window of chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from hub.core.errors import BadRequest, IntegrityError, Internal
from hub.core.wire import frames

if TYPE_CHECKING:
    from hub.client.session import Session

__all__ = ["CHUNK", "WINDOW", "BlobSource", "Progress", "download", "stream", "upload"]

CHUNK: Final = 256 * 1024
"""Bytes per ``blobChunk``/``getBlob`` (the hub accepts up to MAX_BLOB_CHUNK)."""

WINDOW: Final = 8
"""Chunk requests in flight at once per transfer."""

MAX_RESUMES: Final = 16
"""Times one upload asks ``putBlob`` again after a gap before it gives up."""

BlobSource = bytes | bytearray | memoryview | str | Path | AsyncIterable[bytes]
"""What :func:`upload` takes: content, a file path (``str`` or ``Path``), or a stream."""

Progress = Callable[[int, int], None]
"""``progress(done, total)``: bytes moved so far (an upload starts at what the hub held)."""


class _Content:
    """Random access to the content of an upload, with its size and sha256."""

    def __init__(self, size: int, sha256: str, data: bytes | None, path: Path | None) -> None:
        self.size, self.sha256, self._data, self._path = size, sha256, data, path

    async def read(self, offset: int, length: int) -> bytes:
        if self._data is not None:
            return self._data[offset : offset + length]
        assert self._path is not None
        path = self._path

        def read() -> bytes:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(length)

        return await asyncio.to_thread(read)


def _hash_file(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


@contextlib.asynccontextmanager
async def _content(source: BlobSource) -> AsyncIterator[_Content]:
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        yield _Content(len(data), hashlib.sha256(data).hexdigest(), data, None)
        return
    if isinstance(source, str | Path):
        path = Path(source)
        size, sha = await asyncio.to_thread(_hash_file, path)
        yield _Content(size, sha, None, path)
        return
    # A stream: spooled to a temporary file while hashed.
    fd, name = tempfile.mkstemp(prefix="agora-blob-")
    spool = Path(name)
    try:
        digest = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "wb") as f:
            async for part in source:
                digest.update(part)
                size += len(part)
                await asyncio.to_thread(f.write, part)
        yield _Content(size, digest.hexdigest(), None, spool)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(spool)


def _status(reply: frames.ServerFrame) -> frames.BlobStatus:
    if not isinstance(reply, frames.BlobStatus):
        raise Internal(f"unexpected reply to a blob op: {type(reply).__name__}")
    return reply


async def upload(
    session: Session,
    workspace: str,
    source: BlobSource,
    *,
    progress: Progress | None = None,
) -> tuple[str, int]:
    """Store ``source`` in the hub's blob store; return its (sha256, size). Resumes an
    interrupted upload of the same content where the hub holds it. Raises ``TooLarge``
    (over ``max_blob_bytes`` or the workspace's quota), ``Forbidden`` (no write right)."""
    async with _content(source) as content:
        sha, size = content.sha256, content.size
        for _ in range(MAX_RESUMES):
            status = _status(
                await session.request(frames.PutBlob(workspace=workspace, sha256=sha, size=size))
            )
            if status.stored:
                if progress is not None:
                    progress(size, size)
                return sha, size
            try:
                await _send_chunks(session, workspace, content, status.offset, progress)
            except BadRequest as e:
                if "offset" not in e.details:
                    raise
                continue  # the hub lost chunks (a drop): ask where to resume
            _status(
                await session.request(frames.CommitBlob(workspace=workspace, sha256=sha, size=size))
            )
            return sha, size
        raise Internal(f"the upload of blob {sha} did not progress after {MAX_RESUMES} resumes")


async def _send_chunks(
    session: Session,
    workspace: str,
    content: _Content,
    offset: int,
    progress: Progress | None,
) -> None:
    size = content.size
    if progress is not None:
        progress(offset, size)
    inflight: list[asyncio.Task[frames.ServerFrame]] = []
    try:
        at = offset
        while at < size or inflight:
            while at < size and len(inflight) < WINDOW:
                data = await content.read(at, CHUNK)
                frame = frames.BlobChunk(
                    workspace=workspace, sha256=content.sha256, size=size, offset=at, data=data
                )
                inflight.append(asyncio.ensure_future(session.request(frame)))
                at += len(data)
            done = _status(await inflight.pop(0))
            if progress is not None:
                progress(done.offset, size)
    finally:
        for task in inflight:
            task.cancel()


async def stream(
    session: Session,
    workspace: str,
    sha256: str,
    *,
    offset: int = 0,
    length: int | None = None,
    progress: Progress | None = None,
) -> AsyncIterator[bytes]:
    """The blob's bytes from ``offset`` (``length`` of them, or to its end), in order, as the
    chunks arrive. Raises ``NotFound`` (the workspace references no such blob)."""

    def ask(at: int, n: int) -> asyncio.Task[frames.ServerFrame]:
        frame = frames.GetBlob(workspace=workspace, sha256=sha256, offset=at, length=n)
        return asyncio.ensure_future(session.request(frame))

    first = await session.request(
        frames.GetBlob(workspace=workspace, sha256=sha256, offset=offset, length=CHUNK)
    )
    if not isinstance(first, frames.BlobData):
        raise Internal(f"unexpected reply to getBlob: {type(first).__name__}")
    end = first.size if length is None else min(first.size, offset + length)
    data = first.data[: max(0, end - offset)]
    at = offset + len(data)
    if progress is not None:
        progress(at - offset, end - offset)
    yield data
    inflight: list[asyncio.Task[frames.ServerFrame]] = []
    asked = at
    try:
        while at < end:
            while asked < end and len(inflight) < WINDOW:
                n = min(CHUNK, end - asked)
                inflight.append(ask(asked, n))
                asked += n
            reply = await inflight.pop(0)
            if not isinstance(reply, frames.BlobData) or reply.offset != at or not reply.data:
                raise Internal(f"unexpected reply to getBlob at {at} of blob {sha256}")
            at += len(reply.data)
            if progress is not None:
                progress(at - offset, end - offset)
            yield reply.data
    finally:
        for task in inflight:
            task.cancel()


async def download(
    session: Session,
    workspace: str,
    sha256: str,
    dest: str | Path | None = None,
    *,
    progress: Progress | None = None,
) -> bytes | Path:
    """The whole blob: as bytes, or written to ``dest`` (returned; a temporary file beside
    it is renamed onto it once the content hashes right). Raises ``NotFound``,
    :class:`~hub.core.errors.IntegrityError` when the bytes do not hash to ``sha256``."""
    digest = hashlib.sha256()
    if dest is None:
        parts = bytearray()
        async for part in stream(session, workspace, sha256, progress=progress):
            digest.update(part)
            parts += part
        _check(digest, sha256)
        return bytes(parts)
    target = Path(dest)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            async for part in stream(session, workspace, sha256, progress=progress):
                digest.update(part)
                await asyncio.to_thread(f.write, part)
        _check(digest, sha256)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def _check(digest: hashlib._Hash, sha256: str) -> None:
    if digest.hexdigest() != sha256:
        raise IntegrityError(f"blob {sha256} arrived with other content", sha256=sha256)
