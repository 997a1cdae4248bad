"""The local busybox image (backends/container/images.py) and ``agora images``
(hub/commands/images.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from backends.container.images import (
    ImageBuildError,
    find_static_busybox,
    image_is_current,
    is_static_elf,
    make_busybox_context,
)
from hub.cli import main
from tests.support.docker import docker_available
from tests.support.require import require


def static_busybox() -> Path:
    try:
        return find_static_busybox()
    except ImageBuildError as e:
        require("docker", False, f"no static busybox for the image: {e}")
        raise


def test_missing_busybox_names_the_places_searched(tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError) as excinfo:
        find_static_busybox((str(tmp_path / "a"), str(tmp_path / "b")))
    assert str(tmp_path / "a") in str(excinfo.value) and "busybox-static" in str(excinfo.value)


def test_dynamic_executables_are_not_static(tmp_path: Path) -> None:
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert not is_static_elf(tmp_path / "script")
    assert not is_static_elf(tmp_path / "missing")
    assert not is_static_elf(Path("/bin/sh"))  # Debian's dash is dynamically linked


def test_context_layout(tmp_path: Path) -> None:
    busybox = static_busybox()
    make_busybox_context(tmp_path, busybox)
    rootfs = tmp_path / "rootfs"
    assert is_static_elf(rootfs / "bin" / "busybox")
    assert os.readlink(rootfs / "bin" / "sh") == "busybox"
    assert (rootfs / "bin" / "nc").is_symlink()
    assert (rootfs / "tmp").stat().st_mode & 0o7777 == 0o1777
    assert (rootfs / "workspace").is_dir()
    assert "nobody:x:65534" in (rootfs / "etc" / "passwd").read_text()
    assert (tmp_path / "Dockerfile").read_text().startswith("FROM scratch\n")


def test_images_command_builds_and_checks(capsys: pytest.CaptureFixture[str]) -> None:
    ok, why = docker_available()
    require("docker", ok, why)
    static_busybox()
    import docker

    tag = f"agora-test/busybox:{os.getpid()}"
    client = docker.from_env()
    try:
        assert main(["images", "check", "--tag", tag]) == 1
        assert main(["images", "build", "--tag", tag]) == 0
        assert capsys.readouterr().out.splitlines()[-1].startswith(f"{tag} sha256:")
        assert image_is_current(client, tag)
        assert main(["images", "build", "--tag", tag, "--if-stale"]) == 0
        assert capsys.readouterr().out.strip() == f"{tag} is current"
        assert main(["images", "check", "--tag", tag]) == 0
        output = client.containers.run(
            tag,
            ["sh", "-c", "echo hi from $(id -un)"],
            remove=True,
            user="65534:65534",
            network_mode="none",
        )
        assert output == b"hi from nobody\n"
    finally:
        from contextlib import suppress

        with suppress(Exception):
            client.images.remove(tag, force=True)
        client.close()


def test_images_command_without_engine(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["images", "check", "--docker-host", f"unix://{tmp_path}/none.sock"])
    assert code == 2
    assert "not reachable" in capsys.readouterr().err


def test_cli_lists_images() -> None:
    with pytest.raises(SystemExit):
        main(["images", "--help"])
    assert "images" in sys.modules["hub.cli"].COMMANDS
