"""``agora serve`` in a subprocess, as a user runs it: :class:`HubProcess` is the one launcher of
the tests, :class:`HubStarter` the bookkeeping of the hubs one test (or module) starts.

A hub gets a data directory, optionally an ``agora.toml``, a port (0: the OS picks one, kept for
:meth:`HubProcess.restart`), the HTTP port off (``--no-a2a --no-http``) unless an A2A port (the
HTTP port with A2A) or an ``http_port`` (the HTTP port without A2A: ``--no-a2a``) is given,
extra command-line arguments and environment variables, and ``AGORA_SECRET``. It is ready when
its banner (``agora serving ws://HOST:PORT (data DIR)``, then ``agora A2A on http://…`` with
A2A, ``agora HTTP on http://…`` without) is on stdout; its stderr goes to a file beside the data
directory (:meth:`HubProcess.log`).
"""

from __future__ import annotations

import itertools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from hub.auth import TokenSigner
from tests.support.docker import remove_containers_of
from tests.support.paths import REPO
from tests.support.tokens import SECRET, TTL_S, make_signer, mint

BANNER_TIMEOUT: Final = 30.0
"""Seconds to wait for the banner (a loaded machine imports slowly; a hub that never listens
fails the test)."""

STOP_TIMEOUT: Final = 30.0
LOG_TAIL: Final = 6000  # characters of stderr quoted in a failure

_WS_BANNER: Final = re.compile(r"agora serving (?P<url>ws://\S+) \(data (?P<data>.*)\)")
_HTTP_BANNER: Final = re.compile(r"agora (?P<door>A2A|HTTP) on (?P<url>http://\S+)")


class HubProcess:
    """One ``agora serve`` subprocess (see the module doc). ``secret`` may be changed before a
    :meth:`restart` (a hub that comes back with another key)."""

    def __init__(
        self,
        data_dir: Path,
        config: Path | None = None,
        *,
        port: int = 0,
        a2a_port: int | None = None,
        http_port: int | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        secret: str = SECRET,
    ) -> None:
        self.data_dir = data_dir
        self.config = config
        self.port = port
        self.a2a_port = a2a_port
        self.http_port = a2a_port if a2a_port is not None else http_port
        self.http_url = ""
        self.args = tuple(args)
        self.env = dict(env or {})
        self.secret = secret
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.a2a_url = ""
        self.banner = ""
        self.stderr_path = data_dir.parent / f"{data_dir.name}.stderr.log"
        self.killed = False  # its last run ended with SIGKILL: no stop swept its containers

    # -- running it ----------------------------------------------------------------------------

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "hub", "serve", "--port", str(self.port)]
        argv += ["--data", str(self.data_dir)]
        if self.a2a_port is None:
            argv.append("--no-a2a")
        if self.http_port is None:
            argv.append("--no-http")
        else:
            argv += ["--http-port", str(self.http_port)]
        if self.config is not None:
            argv += ["--config", str(self.config)]
        return argv + list(self.args)

    def environ(self) -> dict[str, str]:
        env = dict(os.environ, AGORA_SECRET=self.secret, **self.env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env.pop("PYTHONASYNCIODEBUG", None)  # the hub under test runs at full speed
        return env

    def start(self) -> HubProcess:
        """Start and wait for the banner; AssertionError (quoting stderr) if it never comes."""
        assert not self.running, "already running"
        self.killed = False  # (a start sweeps what the last run left)
        self.close_pipes()
        with self.stderr_path.open("ab") as stderr:
            self.proc = subprocess.Popen(
                self.argv(), cwd=REPO, env=self.environ(), stdout=subprocess.PIPE, stderr=stderr
            )
        lines = self._read_lines(1 if self.http_port is None else 2)
        self.banner = lines[0]
        ws = _WS_BANNER.fullmatch(self.banner)
        assert ws is not None, self.banner
        assert ws["data"] == str(self.data_dir), self.banner
        self.url = ws["url"]
        self.port = int(self.url.rsplit(":", 1)[1])  # a restart comes back on the same port
        if self.http_port is not None:
            http = _HTTP_BANNER.fullmatch(lines[1])
            assert http is not None, lines
            assert (http["door"] == "A2A") == (self.a2a_port is not None), lines
            self.http_url = http["url"]
            self.http_port = int(self.http_url.rsplit(":", 1)[1])
            if self.a2a_port is not None:
                self.a2a_url, self.a2a_port = self.http_url, self.http_port
        return self

    def restart(self) -> HubProcess:
        """Start again (after :meth:`kill` or :meth:`terminate`) on the same port(s) and data."""
        return self.start()

    def _read_lines(self, count: int) -> list[str]:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + BANNER_TIMEOUT
        data = b""
        while data.count(b"\n") < count:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, left))
            if not ready:
                self.kill()
                raise AssertionError(f"no banner within {BANNER_TIMEOUT}s: {self.log()}")
            chunk = os.read(self.proc.stdout.fileno(), 1024)
            if not chunk:
                self.proc.wait(STOP_TIMEOUT)
                raise AssertionError(f"agora serve exited early: {self.log()}")
            data += chunk
        return data.decode().splitlines()[:count]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM and wait; the exit code (AssertionError if SIGTERM is ignored)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stacks = self._stacks()
            self.kill()
            raise AssertionError(
                f"agora serve ignored SIGTERM for {timeout}s; its log ends:\n{self.log()}{stacks}"
            ) from None

    def _stacks(self) -> str:
        """Where a hub that will not stop is waiting: its threads' Python stacks, by py-spy
        where it is installed (a diagnostic for a rare hang; nothing without it)."""
        spy = shutil.which("py-spy")
        if spy is None or self.proc is None:
            return ""
        try:
            done = subprocess.run(
                [spy, "dump", "--nonblocking", "--pid", str(self.proc.pid)],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"\n(py-spy dump failed: {e})"
        return f"\npy-spy dump:\n{done.stdout[-LOG_TAIL:]}{done.stderr[-2000:]}"

    def kill(self) -> None:
        """SIGKILL: a crash (no shutdown, no close frames, no goodbye to the database)."""
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
            self.killed = True

    def close_pipes(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def log(self) -> str:
        """The tail of the hub's stderr (all its starts)."""
        try:
            return self.stderr_path.read_text(errors="replace")[-LOG_TAIL:]
        except OSError:
            return ""

    # -- speaking to it ------------------------------------------------------------------------

    @property
    def signer(self) -> TokenSigner:
        """A signer with the key the hub runs with."""
        return make_signer(self.secret)

    def token(
        self,
        agent: str = "alice",
        workspaces: Sequence[str] = ("*",),
        rights: Sequence[str] = ("read", "write"),
        *,
        backends: Sequence[str] = (),
        ttl: int = TTL_S,
    ) -> str:
        """A token this hub accepts (signed with its current secret)."""
        return mint(agent, workspaces, rights, backends=backends, ttl=ttl, secret=self.secret)


StartHub = Callable[..., HubProcess]
"""The type of the ``start_*`` fixtures built on :meth:`HubStarter.start`."""


class HubStarter:
    """The hubs started under ``root`` (numbered: ``<name>-N`` data directories, ``agora-N.toml``
    configs). :meth:`close` stops those still running with SIGTERM, each of which must exit 0
    (a test that killed one is fine)."""

    def __init__(self, root: Path, name: str = "data") -> None:
        self.root = root
        self.name = name
        self.started: list[HubProcess] = []
        self._numbers = itertools.count()

    def start(
        self,
        config: str | None = None,
        *,
        data_dir: Path | None = None,
        port: int = 0,
        a2a_port: int | None = None,
        http_port: int | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> HubProcess:
        """A running hub; ``config`` is the text of its agora.toml (none without)."""
        n = next(self._numbers)
        config_path = None
        if config is not None:
            config_path = self.root / f"agora-{n}.toml"
            config_path.write_text(config)
        process = HubProcess(
            data_dir or self.root / f"{self.name}-{n}",
            config_path,
            port=port,
            a2a_port=a2a_port,
            http_port=http_port,
            args=args,
            env=env,
        )
        self.started.append(process)  # before start: a hub whose banner never came is closed too
        return process.start()

    def close(self) -> None:
        failures = []
        for process in self.started:
            if process.running:
                code = process.terminate()
                if code != 0:
                    failures.append(f"{process.data_dir.name} exit {code}: {process.log()}")
            process.close_pipes()
        # A hub killed last leaves its warm containers (its next start would sweep them):
        # removed here, so the suite leaves none on the engine.
        killed = {p.data_dir for p in self.started if p.killed}
        if killed:
            remove_containers_of(killed)
        assert not failures, failures
