"""What a container of the ``container`` backend is made of: the default policy, the labels,
the Engine API ``ContainerCreate`` body and the warm launcher's prelude. Pure.
"""

from __future__ import annotations

import base64
import shlex
from typing import Any, Final

from hub.core.execution.errors import InvalidRequest
from hub.core.execution.policy import FilesystemPolicy, SandboxPolicy
from hub.core.execution.request import ExecutionRequest

__all__ = [
    "DEFAULT_CONTAINER_POLICY",
    "LAUNCHER",
    "base_environment",
    "command_for",
    "container_config",
    "environment_for",
    "warm_prelude",
    "working_dir_for",
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
LABEL_WORKER: Final = "agora.worker"  # the worker of ``agora serve --workers`` that runs it
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


def command_for(request: ExecutionRequest) -> list[str]:
    """The container command. Raises :class:`InvalidRequest`."""
    source = request.source or ""
    if source:
        if len(source.encode()) > MAX_SHELL_SOURCE:
            raise InvalidRequest(
                f"a shell source is limited to {MAX_SHELL_SOURCE} bytes", field="source"
            )
        return ["/bin/sh", "-c", source, "sh", *request.argv]
    if not request.argv:
        raise InvalidRequest("a command needs source text or argv", field="source")
    return list(request.argv)


def base_environment() -> dict[str, str]:
    return {"PATH": CONTAINER_PATH, "HOME": SCRATCH, "LANG": "C.UTF-8"}


def environment_for(request: ExecutionRequest) -> dict[str, str]:
    env = base_environment()
    env.update(request.env)  # validated: every name is in the policy's allow-list
    return env


def working_dir_for(request: ExecutionRequest) -> str:
    """The in-container working directory (warm runs have no workspace: always /tmp)."""
    cwd = request.effective_cwd
    if not request.policy.filesystem.mounts_workspace:
        return SCRATCH
    return WORKSPACE if cwd == "." else f"{WORKSPACE}/{cwd}"
