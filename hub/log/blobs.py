"""Content-addressed blob storage on the local file system.

A blob lives at ``root/<first two hex digits>/<remaining 62 hex digits>`` of its sha256, the
layout git uses for loose objects: it keeps directories small and makes the name the checksum.
Writes are crash-safe: a temporary file in the target directory is written and fsynced, renamed
into place (atomic on POSIX), then the directory is fsynced so the rename itself is durable.
All file work runs in a worker thread (``asyncio.to_thread``); the event loop never blocks.

Chunked uploads (the wire's ``putBlob``) grow a file ``root/.uploads/<sha256>.<size>.<uploader>``
(``<uploader>`` a hash of the agent's name: one agent never writes into another's upload); the
commit first renames it to a private name no writer opens, then hashes it in a worker thread,
fsyncs it and renames it into place, so a blob only ever appears whole and checked, with the
bytes that were hashed. A partial upload survives a restart: the client resumes at its length.

Grants (which workspace may reference a blob, and pays for it in its quota) are files
``root/.grants/<workspace>/<sha256>`` holding the size and the agent; their mtime is when.

Intents (:class:`hub.log.base.BlobIntent`: a publish's inline content stored before its event
is committed) are files ``root/.intents/<hash of workspace, event id, sha256>`` holding the
intent as JSON, written durably before the blob. A blob's stored time is its file's mtime: one
created for an intent carries the intent's stamp, and every later use (:meth:`touch`) moves it
strictly forward and fsyncs it, so the orphan sweep can tell a blob nobody took up since.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import msgspec

from hub.core.errors import BadRequest, IntegrityError, NotFound, TooLarge, Unavailable
from hub.core.validation import DEFAULT_MAX_BLOB_BYTES, SHA256_RE, validate_workspace
from hub.log.base import BlobIntent, BlobStore, stamp_before

__all__ = ["DEFAULT_MAX_BLOB_BYTES", "GRANTS_DIR", "INTENTS_DIR", "UPLOADS_DIR", "FileBlobStore"]
_TMP_PREFIX: Final = ".tmp-"
UPLOADS_DIR: Final = ".uploads"
GRANTS_DIR: Final = ".grants"
INTENTS_DIR: Final = ".intents"
_COMMITTING: Final = ".commit-"
_HASH_CHUNK: Final = 1024 * 1024


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

    async def put(self, data: bytes, *, stamp: int | None = None) -> str:
        """Store ``data`` durably; return its sha256. Idempotent (a stored blob is touched;
        a new one's mtime is ``stamp``, in microseconds, when given).

        Raises :class:`TooLarge` above ``max_bytes``, :class:`Unavailable` on an I/O error.
        """
        if len(data) > self.max_bytes:
            raise TooLarge(
                f"blob is {len(data)} bytes; the limit is {self.max_bytes}",
                size=len(data),
                limit=self.max_bytes,
            )
        return await asyncio.to_thread(self._put_sync, bytes(data), stamp)

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

    async def size(self, sha256: str) -> int:
        path = self.path_of(sha256)
        try:
            return (await asyncio.to_thread(path.stat)).st_size
        except FileNotFoundError as e:
            raise NotFound(f"blob {sha256} not found", sha256=sha256) from e
        except OSError as e:
            raise Unavailable(f"cannot read blob {sha256}: {e}") from e

    async def read(self, sha256: str, offset: int, length: int) -> bytes:
        path = self.path_of(sha256)
        return await asyncio.to_thread(self._read_sync, sha256, path, offset, length)

    def _upload_path(self, sha256: str, size: int, uploader: str) -> Path:
        self.path_of(sha256)  # validates the name
        name = f"{sha256}.{size}"
        if uploader:
            name += "." + hashlib.sha256(uploader.encode()).hexdigest()[:32]
        return self.root / UPLOADS_DIR / name

    async def upload_offset(self, sha256: str, size: int, *, uploader: str = "") -> int:
        self._check_size(size)
        if not uploader and await self.has(sha256):
            return size  # the hub's own content: nothing to prove
        path = self._upload_path(sha256, size, uploader)

        def begin() -> int:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab") as f:
                return f.tell()

        try:
            return await asyncio.to_thread(begin)
        except OSError as e:
            raise Unavailable(f"cannot begin the upload of blob {sha256}: {e}") from e

    async def write_chunk(
        self, sha256: str, size: int, offset: int, data: bytes, *, uploader: str = ""
    ) -> int:
        path = self._upload_path(sha256, size, uploader)
        if offset < 0 or offset + len(data) > size:
            raise BadRequest(
                f"a chunk at {offset} of {len(data)} bytes does not fit a blob of {size}",
                field="$.offset",
            )
        return await asyncio.to_thread(self._write_sync, sha256, path, offset, data)

    async def commit(
        self, sha256: str, size: int, *, uploader: str = "", stamp: int | None = None
    ) -> None:
        if not uploader and await self.touch(sha256):
            return
        path = self._upload_path(sha256, size, uploader)
        await asyncio.to_thread(self._commit_sync, sha256, size, path, stamp)

    # -- grants -------------------------------------------------------------------------------

    def _grant_path(self, workspace: str, sha256: str) -> Path:
        self.path_of(sha256)
        validate_workspace(workspace)
        return self.root / GRANTS_DIR / workspace / sha256

    async def grant(self, workspace: str, sha256: str, size: int, agent: str) -> None:
        path = self._grant_path(workspace, sha256)

        def write() -> None:
            if path.is_file():
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
            tmp.write_text(f"{size} {agent}\n")
            os.replace(tmp, path)

        try:
            await asyncio.to_thread(write)
        except OSError as e:
            raise Unavailable(f"cannot record the grant of blob {sha256}: {e}") from e

    async def grants(self, workspace: str) -> dict[str, int]:
        validate_workspace(workspace)
        directory = self.root / GRANTS_DIR / workspace

        def scan() -> dict[str, int]:
            found: dict[str, int] = {}
            if not directory.is_dir():
                return found
            for f in directory.iterdir():
                if SHA256_RE.fullmatch(f.name):
                    with contextlib.suppress(OSError, ValueError):
                        found[f.name] = int(f.read_text().split(" ", 1)[0])
            return found

        try:
            return await asyncio.to_thread(scan)
        except OSError as e:
            raise Unavailable(f"cannot read the grants of {workspace!r}: {e}") from e

    async def list_grants(self) -> AsyncIterator[tuple[str, str, float]]:
        top = self.root / GRANTS_DIR

        def scan() -> list[tuple[str, str, float]]:
            found: list[tuple[str, str, float]] = []
            if not top.is_dir():
                return found
            for d in top.iterdir():
                if not d.is_dir():
                    continue
                for f in d.iterdir():
                    if SHA256_RE.fullmatch(f.name):
                        with contextlib.suppress(OSError):
                            found.append((d.name, f.name, f.stat().st_mtime))
            return found

        for item in await asyncio.to_thread(scan):
            yield item

    async def revoke(self, workspace: str, sha256: str) -> bool:
        return await asyncio.to_thread(_unlink, self._grant_path(workspace, sha256))

    async def delete(self, sha256: str) -> bool:
        return await asyncio.to_thread(_unlink, self.path_of(sha256))

    async def list(self) -> AsyncIterator[tuple[str, int, float]]:
        def scan() -> list[tuple[str, int, float]]:
            found: list[tuple[str, int, float]] = []
            if not self.root.is_dir():
                return found
            for d in self.root.iterdir():
                if len(d.name) != 2 or not d.is_dir():
                    continue
                for f in d.iterdir():
                    sha = d.name + f.name
                    if SHA256_RE.fullmatch(sha):
                        try:
                            st = f.stat()
                        except FileNotFoundError:
                            continue  # removed since listed (the hub's orphan sweep, a gc)
                        found.append((sha, st.st_size, st.st_mtime))
            return found

        for item in await asyncio.to_thread(scan):
            yield item

    async def purge_uploads(self, before: float) -> int:
        uploads = self.root / UPLOADS_DIR

        def purge() -> int:
            n = 0
            if not uploads.is_dir():
                return 0
            for f in uploads.iterdir():
                with contextlib.suppress(OSError):
                    if f.stat().st_mtime < before:
                        f.unlink()
                        n += 1
            return n

        return await asyncio.to_thread(purge)

    # -- intents --------------------------------------------------------------------------

    def _intent_path(self, workspace: str, event_id: str, sha256: str) -> Path:
        self.path_of(sha256)
        validate_workspace(workspace)
        # Hashed: an event id may hold characters a file name may not.
        key = hashlib.sha256(f"{workspace}\n{event_id}\n{sha256}".encode()).hexdigest()
        return self.root / INTENTS_DIR / key

    async def touch(self, sha256: str) -> bool:
        path = self.path_of(sha256)

        def touch() -> bool:
            try:
                _touch_sync(path)
            except FileNotFoundError:
                return False
            return True

        try:
            return await asyncio.to_thread(touch)
        except OSError as e:
            raise Unavailable(f"cannot touch blob {sha256}: {e}") from e

    async def intend(self, workspace: str, event_id: str, sha256: str, size: int) -> BlobIntent:
        path = self._intent_path(workspace, event_id, sha256)
        intent = BlobIntent(workspace, event_id, sha256, size, time.time_ns() // 1000)

        def write() -> None:
            created = _mkdirs(path.parent)
            tmp = path.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, msgspec.json.encode(intent))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            for d in (path.parent, *created):
                _fsync_dir(d)

        try:
            await asyncio.to_thread(write)
        except OSError as e:
            raise Unavailable(f"cannot record the intent to store blob {sha256}: {e}") from e
        return intent

    async def intents(self, before: float) -> tuple[BlobIntent, ...]:
        top = self.root / INTENTS_DIR
        cutoff = stamp_before(before)

        def scan() -> list[BlobIntent]:
            found: list[BlobIntent] = []
            if not top.is_dir():
                return found
            for f in top.iterdir():
                if f.name.startswith(_TMP_PREFIX):
                    continue  # an intent whose write a crash cut: its blob was never put
                with contextlib.suppress(OSError, msgspec.DecodeError):
                    intent = msgspec.json.decode(f.read_bytes(), type=BlobIntent)
                    if intent.stamp < cutoff:
                        found.append(intent)
            return found

        try:
            return tuple(await asyncio.to_thread(scan))
        except OSError as e:
            raise Unavailable(f"cannot read the blob intents: {e}") from e

    async def settle(self, intent: BlobIntent) -> None:
        path = self._intent_path(intent.workspace, intent.event_id, intent.sha256)

        def remove() -> None:
            # Not fsynced: an intent that comes back after a crash is settled again by the
            # sweep (its event is found, or its blob was removed already).
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

        try:
            await asyncio.to_thread(remove)
        except OSError as e:
            raise Unavailable(f"cannot drop the intent of blob {intent.sha256}: {e}") from e

    async def delete_untouched(self, sha256: str, stamp: int) -> bool:
        path = self.path_of(sha256)

        def remove() -> bool:
            try:
                if path.stat().st_mtime_ns // 1000 > stamp:
                    return False
                # Out of every reader's reach first, then checked again: a touch between the
                # check and the move is seen and the blob put back.
                private = path.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
                os.replace(path, private)
            except FileNotFoundError:
                return False
            if private.stat().st_mtime_ns // 1000 > stamp:
                # Put back, never over a blob stored meanwhile (which is touched instead).
                try:
                    _install_sync(private, path, after=stamp)
                finally:
                    private.unlink()
                return False
            private.unlink()
            return True

        try:
            return await asyncio.to_thread(remove)
        except OSError as e:
            raise Unavailable(f"cannot remove blob {sha256}: {e}") from e

    # -- worker-thread side -----------------------------------------------------------------

    def _read_sync(self, sha256: str, path: Path, offset: int, length: int) -> bytes:
        try:
            with open(path, "rb") as f:
                total = os.fstat(f.fileno()).st_size
                if offset < 0 or offset > total:
                    raise BadRequest(
                        f"offset {offset} is beyond the blob's {total} bytes", field="$.offset"
                    )
                f.seek(offset)
                return f.read(max(0, length))
        except FileNotFoundError as e:
            raise NotFound(f"blob {sha256} not found", sha256=sha256) from e
        except OSError as e:
            raise Unavailable(f"cannot read blob {sha256}: {e}") from e

    def _write_sync(self, sha256: str, path: Path, offset: int, data: bytes) -> int:
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError as e:
            raise NotFound(
                f"no upload of blob {sha256} under way: send putBlob first", sha256=sha256
            ) from e
        except OSError as e:
            raise Unavailable(f"cannot write blob {sha256}: {e}") from e
        try:
            held = os.fstat(fd).st_size
            if offset > held:
                raise BadRequest(
                    f"chunk at {offset} leaves a gap: the upload holds {held} bytes",
                    field="$.offset",
                    offset=held,
                )
            view = memoryview(data)
            at = offset
            while view:
                n = os.pwrite(fd, view, at)
                view, at = view[n:], at + n
            return max(held, at)
        except OSError as e:
            raise Unavailable(f"cannot write blob {sha256}: {e}") from e
        finally:
            os.close(fd)

    def _commit_sync(self, sha256: str, size: int, upload: Path, stamp: int | None) -> None:
        target = self.root / sha256[:2] / sha256[2:]
        # First out of every writer's reach (a writer opens the upload by its name), so the
        # bytes hashed are the bytes stored.
        private = upload.parent / f"{_COMMITTING}{uuid.uuid4().hex}"
        try:
            os.replace(upload, private)
        except FileNotFoundError as e:
            raise NotFound(
                f"no upload of blob {sha256} under way: send putBlob first", sha256=sha256
            ) from e
        except OSError as e:
            raise Unavailable(f"cannot commit blob {sha256}: {e}") from e
        try:
            with open(private, "rb") as f:
                held = os.fstat(f.fileno()).st_size
                if held != size:
                    os.replace(private, upload)  # put back: the client resumes it
                    raise BadRequest(
                        f"the upload holds {held} of {size} bytes; send the rest first",
                        field="$.sha256",
                        offset=held,
                    )
                digest = hashlib.sha256()
                while chunk := f.read(_HASH_CHUNK):
                    digest.update(chunk)
                if stamp is not None:  # an intent's: the sweep tells a blob untouched since
                    os.utime(f.fileno(), ns=(stamp * 1000, stamp * 1000))
                os.fsync(f.fileno())
        except OSError as e:
            with contextlib.suppress(OSError):
                private.unlink()
            raise Unavailable(f"cannot commit blob {sha256}: {e}") from e
        if digest.hexdigest() != sha256:
            with contextlib.suppress(OSError):
                private.unlink()
            # The client's fault, not the store's: a bad request (IntegrityError means damage).
            raise BadRequest(
                f"the uploaded content does not hash to {sha256}; upload discarded",
                field="$.sha256",
                actual=digest.hexdigest(),
            )
        try:
            created = _mkdirs(target.parent)
            # Stored already (or meanwhile): the upload only proved its holder has it, and
            # the stored blob is touched, never replaced (see _install_sync).
            if _install_sync(private, target, after=stamp):
                for d in (target.parent, *created):
                    _fsync_dir(d)
        except OSError as e:
            raise Unavailable(f"cannot commit blob {sha256}: {e}") from e
        finally:
            with contextlib.suppress(OSError):
                private.unlink()

    def _put_sync(self, data: bytes, stamp: int | None) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / digest[:2] / digest[2:]
        try:
            if path.is_file():
                with contextlib.suppress(FileNotFoundError):  # swept meanwhile: store it again
                    _touch_sync(path, after=stamp)
                    return digest  # content-addressed: same name, same bytes
            created = _mkdirs(path.parent)
            tmp = path.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    if stamp is not None:
                        os.utime(fd, ns=(stamp * 1000, stamp * 1000))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                installed = _install_sync(tmp, path, after=stamp)
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
            # The link is durable only once its directory entry is; a newly created
            # directory also needs its own entry in the parent synced.
            if installed:
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


def _install_sync(tmp: Path, path: Path, *, after: int | None) -> bool:
    """Give the finished file ``tmp`` the name ``path`` unless a blob is stored there already
    (or is stored meanwhile by another put or commit): then that one is touched past ``after``
    instead. Whether ``tmp`` was installed; the caller removes the ``tmp`` name either way.

    A hard link, never a rename over it: a blob stored concurrently may already carry a
    later stamp (or a touch) that keeps it from another intent's sweep; replacing it with
    this file (an older intent's stamp, an upload's last write) would let that sweep remove
    a blob someone references."""
    while True:
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            pass
        try:
            _touch_sync(path, after=after)
            return False
        except FileNotFoundError:
            continue  # swept between the two: link it again


def _touch_sync(path: Path, *, after: int | None = None) -> None:
    """Move the file's mtime strictly forward (at least a microsecond, whatever the clock
    says; past the stamp ``after`` too) and make it durable. Raises ``FileNotFoundError``
    when it is absent, or when it was moved away while it was touched (a sweep's removal:
    the file touched may be unlinked already, so the touch does not count)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        ns = max(time.time_ns(), st.st_mtime_ns + 1000, ((after or 0) + 1) * 1000)
        os.utime(fd, ns=(ns, ns))
        os.fsync(fd)
    finally:
        os.close(fd)
    # Checked after the touch: a sweep (delete_untouched) that moved the file aside before
    # it either sees the new mtime and puts the file back, or had decided already and the
    # name no longer leads to this file.
    now = os.stat(path)
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        raise FileNotFoundError(errno.ENOENT, "blob moved while touched", str(path))


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


def _unlink(path: Path) -> bool:
    """Remove ``path``; whether it was there (a grant or blob already gone is no error)."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
