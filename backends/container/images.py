"""Locally built container images: ``agora/busybox:1`` (``FROM scratch`` + a static busybox).

No registry is ever contacted. The build context is made in a temporary directory:

    rootfs/bin/busybox          a copy of the host's static busybox (Debian: busybox-static)
    rootfs/bin/<applet>         a symlink to busybox for every applet (sh, cat, nc, ...)
    rootfs/tmp                  mode 1777 (Docker copies it onto the tmpfs mounted there)
    rootfs/workspace            the mount point of the workspace
    rootfs/etc/passwd, group    root and nobody (65534), so ``id``/``whoami`` print names
    Dockerfile                  FROM scratch / COPY rootfs/ / / CMD ["/bin/sh"]

The image carries the label ``agora.busybox.sha256`` (the binary's digest), so a rebuild is
needed only when the host's busybox changes: :func:`image_is_current`.

The functions taking a ``client`` are blocking (the docker SDK is); call them in a thread.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Final

__all__ = [
    "BUSYBOX_CANDIDATES",
    "DEFAULT_IMAGE",
    "ImageBuildError",
    "build_busybox_image",
    "find_static_busybox",
    "image_is_current",
    "make_busybox_context",
]

DEFAULT_IMAGE: Final = "agora/busybox:1"
BUSYBOX_CANDIDATES: Final = ("/bin/busybox", "/usr/bin/busybox", "/usr/local/bin/busybox")
LABEL_SHA: Final = "agora.busybox.sha256"
LABEL_KIND: Final = "agora.image"

_PASSWD: Final = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n"
_GROUP: Final = "root:x:0:\nnogroup:x:65534:\n"
_DOCKERFILE: Final = 'FROM scratch\nCOPY rootfs/ /\nCMD ["/bin/sh"]\n'


class ImageBuildError(Exception):
    """The image could not be built (no static busybox, or the engine refused the build)."""


def is_static_elf(path: Path) -> bool:
    """Whether ``path`` is an ELF executable without a program interpreter (statically linked),
    so it runs in an image with no libc."""
    try:
        with path.open("rb") as f:
            header = f.read(64)
            if header[:4] != b"\x7fELF" or header[4] != 2:  # 64-bit ELF only
                return False
            little = header[5] == 1
            order = "<" if little else ">"
            (phoff,) = struct.unpack_from(order + "Q", header, 0x20)
            phentsize, phnum = struct.unpack_from(order + "HH", header, 0x36)
            for index in range(phnum):
                f.seek(phoff + index * phentsize)
                (p_type,) = struct.unpack(order + "I", f.read(4))
                if p_type == 3:  # PT_INTERP: dynamically linked
                    return False
            return True
    except (OSError, struct.error):
        return False


def find_static_busybox(candidates: tuple[str, ...] = BUSYBOX_CANDIDATES) -> Path:
    """The first statically linked busybox among ``candidates``. Raises
    :class:`ImageBuildError` naming the places searched (install ``busybox-static``)."""
    for candidate in candidates:
        path = Path(candidate)
        if path.is_file() and is_static_elf(path):
            return path
    raise ImageBuildError(
        f"no statically linked busybox found (searched {', '.join(candidates)}); "
        "install it, e.g. `apt-get install busybox-static`"
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _applets(busybox: Path) -> list[str]:
    out = subprocess.run(
        [str(busybox), "--list"], capture_output=True, check=True, timeout=30, env={}
    ).stdout.decode()
    return sorted({a for a in out.split() if a and "/" not in a and a != "busybox"})


def make_busybox_context(dest: Path, busybox: Path) -> None:
    """Write the build context (see the module docstring) into the empty directory ``dest``."""
    rootfs = dest / "rootfs"
    bindir = rootfs / "bin"
    bindir.mkdir(parents=True)
    shutil.copyfile(busybox, bindir / "busybox")
    os.chmod(bindir / "busybox", 0o755)
    for applet in _applets(busybox):
        os.symlink("busybox", bindir / applet)
    (rootfs / "tmp").mkdir()
    os.chmod(rootfs / "tmp", 0o1777)
    (rootfs / "workspace").mkdir()
    os.chmod(rootfs / "workspace", 0o755)
    (rootfs / "etc").mkdir()
    (rootfs / "etc" / "passwd").write_text(_PASSWD)
    (rootfs / "etc" / "group").write_text(_GROUP)
    (dest / "Dockerfile").write_text(_DOCKERFILE)


def image_is_current(client: Any, tag: str = DEFAULT_IMAGE, busybox: Path | None = None) -> bool:
    """Whether ``tag`` exists and was built from this host's busybox. Blocking."""
    import docker.errors  # imported late: only image commands and the container backend need it

    try:
        attrs = client.api.inspect_image(tag)
    except docker.errors.ImageNotFound:
        return False
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    if busybox is None:
        try:
            busybox = find_static_busybox()
        except ImageBuildError:
            return True  # it exists, and nothing here could rebuild it anyway
    return bool(labels.get(LABEL_SHA) == file_sha256(busybox))


def build_busybox_image(client: Any, tag: str = DEFAULT_IMAGE, busybox: Path | None = None) -> str:
    """Build ``tag`` from the host's static busybox; returns the image id. Blocking.

    Uses the engine's classic builder with ``network_mode="none"`` and ``pull=False``: nothing
    is downloaded. Raises :class:`ImageBuildError`.
    """
    import docker.errors

    busybox = busybox or find_static_busybox()
    sha = file_sha256(busybox)
    with tempfile.TemporaryDirectory(prefix="agora-image-") as tmp:
        context = Path(tmp)
        make_busybox_context(context, busybox)
        try:
            image, _logs = client.images.build(
                path=str(context),
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="none",
                labels={LABEL_KIND: "busybox", LABEL_SHA: sha},
            )
        except (docker.errors.BuildError, docker.errors.APIError) as e:
            raise ImageBuildError(f"building {tag} failed: {e}") from e
    image_id: str = image.id
    return image_id
