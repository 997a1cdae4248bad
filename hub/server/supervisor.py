"""The supervisor of ``agora serve --workers N``: start N worker processes and keep them up.

What must happen once happens here, before any worker starts (``agora serve`` has already
created the data directory, the token secret and the checkpoint key by then, so no two
workers race to create them): the store is opened (migrations) and the start-up recovery runs
(:meth:`hub.server.app.Hub.recover_for_workers`). The supervisor then reserves the port (a
socket bound with ``SO_REUSEPORT`` and never listening: port 0 becomes one fixed port every
worker, and every restart, binds) and starts the workers: ``python -m hub serve`` with the
same arguments plus ``--worker-index i --port P``. On SQLite it is the file's one writer
meanwhile: ``agora serve`` opens the writing store and serves the workers' writes before any
worker starts (:mod:`hub.log.handoff`), and closes it after the last one stopped. Only
worker 0 opens the HTTP port (its port is pinned after the first start, so a restarted
worker 0 binds the same one). The token secret reaches the workers in their environment only
(each removes it from its own).

A worker's banner is read from its stdout; once every worker printed one the supervisor prints
the one banner of ``agora serve`` (tests and scripts wait for it). A worker that exits while
the supervisor is not stopping is logged and started again, after a backoff that grows while
restarts come quickly (:data:`RESTART_BACKOFF`); on SQLite, what it left open in the log (its
members' presence, its executions) is closed first, under the node id this supervisor named
that start of it (:mod:`hub.server.reaper`). SIGTERM/SIGINT go to every worker; the
supervisor waits for them and exits 0 (1 when a worker did not stop cleanly).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from hub.core.backoff import Backoff
from hub.core.errors import ConfigError
from hub.server.reaper import WorkerReaper
from hub.server.workers import SOCKET_DIR, UNIX_PATH_MAX, internal_socket, writer_socket

__all__ = ["RESTART_BACKOFF", "Supervisor", "reserve_port", "socket_dir"]

log = logging.getLogger("agora.server")

RESTART_BACKOFF: Final = Backoff(initial=0.1, maximum=5.0, give_up_after=None)
"""Between a worker's exit and its restart; the attempt count resets after
:data:`STABLE_AFTER_S` of uptime."""

STABLE_AFTER_S: Final = 10.0
STOP_TIMEOUT_S: Final = 30.0
"""After SIGTERM, how long a worker has to finish before it is killed."""

_BANNER: Final = "agora serving "
_HTTP_BANNERS: Final = ("agora A2A on http://", "agora HTTP on http://")


def socket_dir(data_dir: Path, workers: int) -> Path:
    """Where the workers' internal sockets go; raises :class:`ConfigError` when their paths
    would exceed the unix socket limit (a data directory too deep: use a shorter one)."""
    directory = data_dir.resolve() / SOCKET_DIR
    longest = max(
        (internal_socket(directory, workers - 1), writer_socket(directory)),
        key=lambda path: len(os.fsencode(path)),
    )
    if len(os.fsencode(longest)) > UNIX_PATH_MAX:
        raise ConfigError(
            f"the workers' sockets ({longest}) would be longer than {UNIX_PATH_MAX} bytes: "
            "use a data directory with a shorter path",
            field="storage.data_dir",
        )
    return directory


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` and not listening: it keeps the
    port (0: one the OS picks) for the workers, and takes no connection itself. Raises
    ``OSError`` when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class Supervisor:
    """Runs ``count`` workers: ``argv`` is ``agora serve``'s own arguments (after ``serve``);
    ``env`` the workers' environment (the secret in it). With a ``reaper`` (SQLite) each start
    of a worker runs under a node id named here, ``<reaper's id>-w<index>.<start>``, and what a
    worker that died left open is closed under that id before it starts again
    (:mod:`hub.server.reaper`). Use :meth:`run`."""

    def __init__(
        self,
        *,
        count: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        host: str,
        port: int,
        http: bool,
        banner_data: Path,
        reaper: WorkerReaper | None = None,
    ) -> None:
        self.count = count
        self.reaper = reaper
        self.nodes: dict[int, str] = {}  # the node id of each worker's current start
        self.argv = list(argv)
        self.env = dict(env)
        self.host = host
        self.port = port
        self.http = http
        self.banner_data = banner_data
        self.http_port: int | None = None  # pinned after worker 0 first opened it
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.stopping = False
        self.restarts = 0
        self.unclean = False
        self.failed = False  # a worker exited 2 before it ever served: bad configuration
        self._announced = asyncio.Event()  # the banner is out (the HTTP one follows it)

    def worker_argv(self, index: int, node: str | None = None) -> list[str]:
        argv = [sys.executable, "-m", "hub", "serve", *self.argv]
        argv += ["--worker-index", str(index), "--workers", str(self.count)]
        if node is not None:
            argv += ["--worker-node", node]
        argv += ["--port", str(self.port)]
        if index != 0 or not self.http:
            argv.append("--no-http")
        elif self.http_port is not None:
            argv += ["--http-port", str(self.http_port)]
        return argv

    async def run(self, stop: asyncio.Event) -> int:
        """Start every worker, print the banner, keep them up until ``stop``, stop them."""
        async with asyncio.TaskGroup() as tg:
            ready = [asyncio.get_running_loop().create_future() for _ in range(self.count)]
            tasks = [
                tg.create_task(self._keep(i, ready[i], stop), name=f"agora-worker-{i}")
                for i in range(self.count)
            ]
            waiting = tg.create_task(stop.wait())
            all_ready: asyncio.Future[list[None]] = asyncio.gather(*ready)
            either: list[asyncio.Future[Any]] = [waiting, all_ready]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not stop.is_set():
                shown = f"[{self.host}]" if ":" in self.host else self.host
                print(
                    f"agora serving ws://{shown}:{self.port} (data {self.banner_data})", flush=True
                )
                log.info("%d workers serving", self.count)
                self._announced.set()
            await stop.wait()
            self.stopping = True
            if not all_ready.done():
                all_ready.cancel()
            del tasks
        if self.failed:
            return 2
        return 1 if self.unclean else 0

    async def _keep(self, index: int, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        """Run worker ``index``, restarting it when it exits, until ``stop``."""
        attempt = 0
        starts = 0
        while not stop.is_set():
            started = time.monotonic()
            node: str | None = None
            if self.reaper is not None:
                node = f"{self.reaper.closed_by}-w{index}.{starts}"
                self.nodes[index] = node
            starts += 1
            proc = await asyncio.create_subprocess_exec(
                *self.worker_argv(index, node),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                env=self.env,
            )
            self.procs[index] = proc
            log.info("worker %d started pid=%d", index, proc.pid)
            assert proc.stdout is not None
            relay = asyncio.create_task(self._relay(index, proc.stdout, ready))
            exited = asyncio.create_task(proc.wait())
            stopping = asyncio.create_task(stop.wait())
            try:
                await asyncio.wait([exited, stopping], return_when=asyncio.FIRST_COMPLETED)
                if stop.is_set() and proc.returncode is None:
                    await self._stop(index, proc)
                await exited
                await relay
            finally:
                for task in (relay, exited, stopping):
                    task.cancel()
                if proc.returncode is None:  # cancelled: never leave a worker behind
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
            code = proc.returncode
            if code == 2 and not ready.done():
                # It never served: bad configuration or an address it cannot bind (its
                # message is on stderr). Restarting would only repeat it.
                self.failed = True
                stop.set()
            if stop.is_set():
                if code != 0:
                    self.unclean = True
                log.info("worker %d stopped (exit %s)", index, code)
                return
            if node is not None:
                await self._reap(index, node, proc.pid)
            if time.monotonic() - started > STABLE_AFTER_S:
                attempt = 0
            delay = RESTART_BACKOFF.delay(attempt)
            attempt += 1
            self.restarts += 1
            log.warning("worker %d exited (code %s); restarting in %.2f s", index, code, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    async def _reap(self, index: int, node: str, pid: int) -> None:
        """Close what worker ``index``'s start ``node`` (process ``pid``) left open, before
        it starts again. A failure is logged, and the worker started all the same: the next
        start of the hub recovers what is still open."""
        assert self.reaper is not None
        alive = [n for i, n in self.nodes.items() if i != index]
        try:
            reaped = await self.reaper.close(node, alive, pid)
        except Exception:
            log.exception("could not close what worker %d (node %s) left open", index, node)
            return
        level = logging.WARNING if reaped.executions or reaped.members else logging.INFO
        log.log(
            level,
            "worker %d (node %s) left %d execution(s) and %d member(s) open: closed",
            index,
            node,
            reaped.executions,
            reaped.members,
        )

    async def _relay(
        self, index: int, stdout: asyncio.StreamReader, ready: asyncio.Future[None]
    ) -> None:
        """A worker's stdout: its banner marks it ready; the HTTP banner (worker 0) is passed
        on (and its port pinned); anything else is passed on as it is."""
        while line := await stdout.readline():
            text = line.decode(errors="replace").rstrip("\n")
            if text.startswith(_BANNER):
                if not ready.done():
                    ready.set_result(None)
                continue
            if text.startswith(_HTTP_BANNERS):
                port = text.rsplit(":", 1)[-1].split("/", 1)[0]
                first = self.http_port is None
                with contextlib.suppress(ValueError):
                    self.http_port = int(port)
                if not first:
                    continue  # a restarted worker 0: the banner was printed once
                await self._announced.wait()
            print(text, flush=True)

    async def _stop(self, index: int, proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            log.error("worker %d did not stop within %g s; killing it", index, STOP_TIMEOUT_S)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
