"""Execution artifacts: the output files a request names by glob (``artifacts: ["out/*.png"]``),
stored as blobs after the run and published as ``artifactPublished`` events caused by the
request (docs/execution.md, "Artifacts").

Globs are relative to the workspace root and cannot leave it (no ``..``, no absolute path).
They are matched in the run's mirror of the workspace (every backend with a filesystem:
process, container, wasm, rust), after the program ended. Only regular files count: a
symbolic link the program made is never followed (it could point anywhere on the host).
At most :data:`MAX_ARTIFACTS` files; each is stored chunk by chunk
(:meth:`hub.log.base.BlobStore.put_file`), never whole in memory, under the intent of its
``artifactPublished`` event (:class:`hub.log.intents.BlobStaging`): a crash before that event
is appended leaves no orphan blob.
"""

from __future__ import annotations

import asyncio
import mimetypes
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Final

from hub.core.errors import AgoraError, BadRequest
from hub.core.events import ArtifactPayload, ArtifactPublished, ArtifactRef, Event
from hub.log.ids import mint_id
from hub.log.intents import BlobStaging

__all__ = ["MAX_ARTIFACTS", "MAX_GLOBS", "artifact_globs", "collect_artifacts"]

MAX_GLOBS: Final = 32
MAX_GLOB_CHARS: Final = 256
MAX_ARTIFACTS: Final = 64
"""Files one execution may publish as artifacts (the first ones in path order)."""


def artifact_globs(globs: Sequence[str]) -> tuple[str, ...]:
    """The request's artifact globs, checked. Raises :class:`BadRequest` (field
    ``artifacts``) for too many, an empty, absolute or escaping glob."""
    if len(globs) > MAX_GLOBS:
        raise BadRequest(f"at most {MAX_GLOBS} artifact globs", field="artifacts")
    out: list[str] = []
    for i, glob in enumerate(globs):
        field = f"artifacts[{i}]"
        if not glob or len(glob) > MAX_GLOB_CHARS or "\x00" in glob or "\\" in glob:
            raise BadRequest(f"artifact glob {glob!r} is empty, too long or malformed", field=field)
        pure = PurePosixPath(glob)
        if pure.is_absolute() or ".." in pure.parts:
            raise BadRequest(
                f"artifact glob {glob!r} must stay within the workspace (relative, no '..')",
                field=field,
            )
        out.append(glob)
    return tuple(out)


def _matches(root: Path, globs: Sequence[str]) -> list[str]:
    """Workspace paths of the regular files under ``root`` matching any glob (sorted)."""
    found: set[str] = set()
    real_root = root.resolve()
    for glob in globs:
        for path in root.glob(glob):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # directories, symbolic links, devices
            if not path.resolve().is_relative_to(real_root):
                continue  # a link among the parent directories
            found.add(path.relative_to(root).as_posix())
            if len(found) >= MAX_ARTIFACTS:
                return sorted(found)
    return sorted(found)


async def collect_artifacts(
    staged: BlobStaging,
    root: Path,
    globs: Sequence[str],
    exec_id: str,
    causation_id: str,
    *,
    budget: int | None = None,
) -> tuple[list[Event], list[ArtifactRef]]:
    """Store the files under ``root`` matching ``globs`` through ``staged`` (each new blob
    under the intent of its draft, which carries the id the intent names); return the
    ``artifactPublished`` drafts (caused by the request ``causation_id``) and their refs for
    the result. A file that cannot be stored (gone, over the blob limit, past the ``budget``:
    the bytes the workspace's quota has left) is left out."""
    paths = await asyncio.to_thread(_matches, root, globs)
    drafts: list[Event] = []
    refs: list[ArtifactRef] = []
    left = budget
    for rel in paths:
        if left is not None:
            try:
                st = await asyncio.to_thread(os.lstat, root / rel)
            except OSError:
                continue
            if st.st_size > left:
                continue  # checked again on what was stored, below
        event_id = mint_id(int(time.time() * 1000))
        try:
            sha, size = await staged.put_file(event_id, root / rel)
        except (AgoraError, OSError):
            continue
        if left is not None:
            if size > left:
                continue  # grew meanwhile: its event is never appended, the staging drops it
            left -= size
        media = mimetypes.guess_type(rel)[0] or "application/octet-stream"
        payload = ArtifactPayload(
            key=rel, media_type=media, size_bytes=size, sha256=sha, blob=sha, exec_id=exec_id
        )
        drafts.append(
            ArtifactPublished(id=event_id, causation_id=causation_id or None, payload=payload)
        )
        refs.append(ArtifactRef(key=rel, size_bytes=size, content_type=media, sha256=sha))
    return drafts, refs
