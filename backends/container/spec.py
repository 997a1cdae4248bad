"""What a container of the ``container`` backend is made of: the default policy, the labels,
the Engine API ``ContainerCreate`` body and the warm launcher's prelude. Pure.
"""

from __future__ import annotations

import base64
import shlex
from typing import Any, Final

from hub.core.execution.policy import FilesystemPolicy, SandboxPolicy

__all__ = [
    "DEFAULT_CONTAINER_POLICY",
    "LAUNCHER",
    "container_config",
    "warm_prelude",
]

MIB: Final = 1024 * 1024
WORKSPACE: Final = "/workspace"
SCRATCH: Final = "/tmp"
CONTAINER_PATH: Final = "/bin:/usr/bin:/sbin:/usr/sbin"
MAX_SHELL_SOURCE: Final = 131_071  # the kernel's limit on one argv string, minus the NUL
WARM_MAX_PRELUDE: Final = 64 * 1024
READ_SIZE: Final = 64 * 1024
LABEL_EXEC: Final = "agora.exec"
LABEL_OWNER: Final = "agora.owner"
LABEL_BACKEND: Final = "agora.backend"
LABEL_POOL: Final = "agora.pool"
# The warm container's command: read one line, decode it, run it (it ends in ``exec``).
LAUNCHER: Final = 'IFS= read -r agora_prelude && eval "$(printf %s "$agora_prelude" | base64 -d)"'

DEFAULT_CONTAINER_POLICY: Final = SandboxPolicy(
    network="disabled",
    filesystem=FilesystemPolicy.workspace_read_write(),
    memory_bytes=512 * MIB,
    pids=256,
    cpus=1.0,
)
"""The default instance policy: network off, the workspace read-write, 512 MiB, 256 pids,
one cpu, 30 s, 1 MiB of each output stream."""


def container_config(
    *,
    image: str,
    command: list[str],
    user: str,
    env: dict[str, str],
    working_dir: str,
    labels: dict[str, str],
    network_mode: str,
    memory_bytes: int | None,
    pids: int | None,
    cpus: float | None,
    mounts: list[dict[str, Any]],
    stdin: bool,
    tmpfs_size: str = "64m",
) -> dict[str, Any]:
    """The Engine API ``ContainerCreate`` body for one execution. Pure."""
    host_config: dict[str, Any] = {
        "NetworkMode": network_mode,
        "ReadonlyRootfs": True,
        "Tmpfs": {SCRATCH: f"rw,nosuid,nodev,size={tmpfs_size}"},
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges"],
        "LogConfig": {"Type": "none", "Config": {}},
        "Mounts": mounts,
        "AutoRemove": False,
        "Privileged": False,
    }
    if memory_bytes is not None:
        host_config["Memory"] = memory_bytes
        host_config["MemorySwap"] = memory_bytes  # the same value: no swap on top
    if pids is not None:
        host_config["PidsLimit"] = pids
    if cpus is not None:
        host_config["NanoCpus"] = int(cpus * 1e9)
    return {
        "Image": image,
        "Cmd": command,
        "Entrypoint": [],
        "User": user,
        "Env": [f"{k}={v}" for k, v in env.items()],
        "WorkingDir": working_dir,
        "Labels": labels,
        "AttachStdin": stdin,
        "OpenStdin": stdin,
        "StdinOnce": stdin,
        "AttachStdout": True,
        "AttachStderr": True,
        "Tty": False,
        "NetworkDisabled": network_mode == "none",
        "HostConfig": host_config,
    }


def warm_prelude(command: list[str], env: dict[str, str], working_dir: str) -> bytes:
    """The line a warm container's launcher runs: ``cd``, ``export`` each variable, ``exec``
    the command; base64 so any byte of the source survives, newline-terminated. Pure."""
    lines = [f"cd {shlex.quote(working_dir)} || exit 126", "unset agora_prelude OLDPWD SHLVL"]
    lines += [f"export {shlex.quote(f'{k}={v}')}" for k, v in env.items()]
    lines.append("exec " + " ".join(shlex.quote(arg) for arg in command))
    return base64.b64encode("\n".join(lines).encode()) + b"\n"
