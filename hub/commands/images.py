"""``agora images build`` and ``agora images check``: the container backend's local images.

``build`` makes ``agora/busybox:1`` (``FROM scratch`` + the host's static busybox; see
:mod:`backends.container.images`) with the engine's builder, offline: nothing is pulled.
``check`` says whether the image exists and matches the host's busybox. Exit codes: 0 done
(``check``: the image is current), 1 the image is missing or stale (``check``), 2 the engine is
unreachable or the build failed.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from hub.commands.common import fail


def register(subparsers: Any) -> None:
    """Add ``images build`` and ``images check`` to the ``agora`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "images", help="build the container backend's local images"
    )
    actions = parser.add_subparsers(dest="images_command", metavar="ACTION", required=True)
    build = actions.add_parser(
        "build",
        help="build agora/busybox:1 from the host's static busybox (no registry)",
        description="Build the default container image from the host's statically linked "
        "busybox (Debian: busybox-static). Nothing is downloaded.",
    )
    _common_args(build)
    build.add_argument("--busybox", metavar="PATH", default=None, help="the busybox binary")
    build.add_argument(
        "--if-stale", action="store_true", help="build only if the image is missing or stale"
    )
    build.set_defaults(func=build_command)
    check = actions.add_parser("check", help="is the image there and current?")
    _common_args(check)
    check.set_defaults(func=check_command)


def _common_args(parser: argparse.ArgumentParser) -> None:
    from backends.container.images import DEFAULT_IMAGE

    parser.add_argument("--tag", default=DEFAULT_IMAGE, help=f"image tag (default {DEFAULT_IMAGE})")
    parser.add_argument(
        "--docker-host",
        metavar="URL",
        default=None,
        help="engine URL (default: DOCKER_HOST or the local socket)",
    )


def _client(args: argparse.Namespace) -> Any:
    from backends.container import connect_engine

    return connect_engine(args.docker_host, 300.0, 2)


async def build_command(args: argparse.Namespace) -> int:
    """``agora images build``: build the image and print its id."""
    from pathlib import Path

    from backends.container.images import ImageBuildError, build_busybox_image, image_is_current
    from hub.core.execution.errors import ExecutionError

    def build() -> str | None:
        client = _client(args)
        try:
            busybox = Path(args.busybox) if args.busybox else None
            if args.if_stale and image_is_current(client, args.tag, busybox):
                return None
            return build_busybox_image(client, args.tag, busybox)
        finally:
            client.close()

    try:
        image_id = await asyncio.to_thread(build)
    except (ExecutionError, ImageBuildError) as e:
        return fail("images build", str(getattr(e, "message", e)))
    print(f"{args.tag} is current" if image_id is None else f"{args.tag} {image_id}")
    return 0


async def check_command(args: argparse.Namespace) -> int:
    """``agora images check``: exit 0 if the image is current, 1 if not."""
    from backends.container.images import image_is_current
    from hub.core.execution.errors import ExecutionError

    def check() -> bool:
        client = _client(args)
        try:
            return bool(image_is_current(client, args.tag))
        finally:
            client.close()

    try:
        current = await asyncio.to_thread(check)
    except ExecutionError as e:
        return fail("images check", e)
    print(f"{args.tag}: {'current' if current else 'missing or stale'}")
    return 0 if current else 1
