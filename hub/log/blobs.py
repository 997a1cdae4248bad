"""Content-addressed blob storage on the local file system.

A blob lives at ``root/<first two hex digits>/<remaining 62 hex digits>`` of its sha256, the
layout git uses for loose objects: it keeps directories small and makes the name the checksum.
Writes are crash-safe: a temporary file in the target directory is written and fsynced, renamed
into place (atomic on POSIX), then the directory is fsynced so the rename itself is durable.
All file work runs in a worker thread (``asyncio.to_thread``); the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import uuid
from pathlib import Path
from typing import Final

from hub.core.errors import BadRequest, IntegrityError, NotFound, TooLarge, Unavailable
from hub.core.validation import SHA256_RE
from hub.log.base import BlobStore

DEFAULT_MAX_BLOB_BYTES: Final = 256 * 1024 * 1024
_TMP_PREFIX: Final = ".tmp-"


class FileBlobStore(BlobStore):
    """Blobs as files under ``root``, addressed by sha256 (lowercase hex).

    ``max_bytes`` bounds one blob; a larger ``put`` raises :class:`hub.core.errors.TooLarge`.
    The directory is created on first use.
    """

    def __init__(self, root: Path, *, max_bytes: int = DEFAULT_MAX_BLOB_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.root = Path(root)
        self.max_bytes = max_bytes

    def path_of(self, sha256: str) -> Path:
        """Where the blob ``sha256`` lives. Raises :class:`BadRequest` for a malformed hash."""
        if not isinstance(sha256, str) or not SHA256_RE.fullmatch(sha256):
            raise BadRequest("blob id must be a lowercase hex sha256", field="sha256")
        return self.root / sha256[:2] / sha256[2:]

    async def put(self, data: bytes) -> str:
        """Store ``data`` durably; return its sha256. Idempotent.

        Raises :class:`TooLarge` above ``max_bytes``, :class:`Unavailable` on an I/O error.
        """
        if len(data) > self.max_bytes:
            raise TooLarge(
                f"blob is {len(data)} bytes; the limit is {self.max_bytes}",
                size=len(data),
                limit=self.max_bytes,
            )
        return await asyncio.to_thread(self._put_sync, bytes(data))

    async def get(self, sha256: str) -> bytes:
        """The blob's content, checked against its hash.

        Raises :class:`NotFound` if absent, :class:`BadRequest` for a malformed hash,
        :class:`IntegrityError` if the file no longer matches its hash, :class:`Unavailable`
        on an I/O error.
        """
        path = self.path_of(sha256)
        return await asyncio.to_thread(self._get_sync, sha256, path)

    async def has(self, sha256: str) -> bool:
        """Whether the blob is stored. Raises :class:`BadRequest` for a malformed hash."""
        path = self.path_of(sha256)
        return await asyncio.to_thread(path.is_file)

    # -- worker-thread side -----------------------------------------------------------------

    def _put_sync(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / digest[:2] / digest[2:]
        try:
            if path.is_file():
                return digest  # content-addressed: same name, same bytes
            created = _mkdirs(path.parent)
            tmp = path.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise
            # The rename is durable only once its directory entry is; a newly created
            # directory also needs its own entry in the parent synced.
            for d in (path.parent, *created):
                _fsync_dir(d)
        except OSError as e:
            raise Unavailable(f"cannot write blob {digest}: {e}") from e
        return digest

    def _get_sync(self, sha256: str, path: Path) -> bytes:
        try:
            data = path.read_bytes()
        except FileNotFoundError as e:
            raise NotFound(f"blob {sha256} not found", sha256=sha256) from e
        except OSError as e:
            raise Unavailable(f"cannot read blob {sha256}: {e}") from e
        if hashlib.sha256(data).hexdigest() != sha256:
            raise IntegrityError(f"blob {sha256} does not match its hash", sha256=sha256)
        return data


def _mkdirs(directory: Path) -> list[Path]:
    """Create ``directory`` and missing parents; return the parents whose entries changed."""
    missing: list[Path] = []
    d = directory
    while not d.exists():
        missing.append(d)
        d = d.parent
    if not missing:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    # Each created directory's entry lives in its parent.
    return [m.parent for m in missing]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
