"""``agora serve``: run the WebSocket hub until SIGTERM or SIGINT.

Prints ``agora serving ws://HOST:PORT (data DIR)`` on stdout once the socket listens (tests and
scripts wait for that line), then logs one line per connection to stderr. On SIGTERM/SIGINT it
stops accepting, closes clients with 1001, finishes pending appends, closes the store and exits
0. Exit 2 for bad configuration or an address that cannot be bound.

The configuration is built here, once: the file (``--config``), then the flags, then the
cluster's environment overrides (:data:`CLUSTER_ENV`, read only here), and passed to the hub
as one :class:`hub.config.HubConfig`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import msgspec

from hub.auth import SECRET_ENV, TokenSigner, load_or_create_secret
from hub.checkpoints import load_or_create_key
from hub.commands.common import add_config_arg, add_data_args, config_from_args, fail
from hub.core.errors import AgoraError, ConfigError
from hub.observe.logs import LOG_FORMATS
from hub.observe.logs import configure as configure_logging

if TYPE_CHECKING:
    from hub.config import HubConfig
    from hub.server.app import Hub
    from hub.server.workers import WorkerRole

CLUSTER_ENV: Final = {
    "AGORA_NODE_ID": "node_id",
    "AGORA_HEARTBEAT_S": "heartbeat_s",
    "AGORA_NODE_TIMEOUT_S": "timeout_s",
    "AGORA_CLUSTER_OWNERS": "owners",
    "AGORA_NODE_URL": "url",
}
"""Environment variables that override ``[cluster]`` keys (docs/operations.md); an empty one
counts as unset."""

_FLAGS: Final = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}

ORPHAN_CHECK_S: Final = 1.0
"""How often a worker of ``--workers`` checks that its supervisor still runs."""

EXIT_FENCED: Final = 75
"""``agora serve``'s exit when the other nodes declared this one dead (EX_TEMPFAIL: start it
again; the supervisor of ``--workers`` does)."""

TRACE_EXPORTERS: Final = ("none", "console", "otlp")
"""``--traces`` (:data:`hub.observe.tracing.EXPORTERS`, not imported: ``agora --help`` does not
load OpenTelemetry)."""


def register(subparsers: Any) -> None:
    """Add ``serve`` to the ``agora`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the WebSocket hub",
        description="Serve the Agora WebSocket protocol (docs/protocol.md) until SIGTERM/SIGINT.",
    )
    parser.add_argument(
        "--host", default=None, help="interface to bind (default: 127.0.0.1, or the config's)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="TCP port; 0 picks a free one (default: 8765, or the config's)",
    )
    parser.add_argument(
        "--http-port",
        "--a2a-port",  # its name before the port served more than A2A
        dest="http_port",
        type=int,
        default=None,
        help="the HTTP port (A2A, /healthz, /readyz, /metrics, other HTTP doors); 0 picks a "
        "free one (default: 8766, or the config's [server] http_port); --a2a-port is an alias",
    )
    parser.add_argument(
        "--no-a2a",
        action="store_true",
        help="drop the A2A routes from the HTTP port (probes, metrics and other doors stay)",
    )
    parser.add_argument("--no-http", action="store_true", help="do not open the HTTP port at all")
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="stderr log lines as text (default) or JSON Lines with workspace, seq, agent, "
        "execId fields",
    )
    parser.add_argument(
        "--traces",
        choices=TRACE_EXPORTERS,
        default="none",
        help="export OpenTelemetry traces: none (default), console (stderr) or otlp "
        "(needs agora-hub[otlp]; endpoint from OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    parser.add_argument(
        "--a2a-grpc-port",
        type=int,
        default=None,
        help="also serve A2A over gRPC on this port; 0 picks a free one (default: [a2a] grpc_port)",
    )
    parser.add_argument(
        "--max-executions",
        type=int,
        default=None,
        metavar="N",
        help="executions running at once on this hub; more are refused busy "
        "(default: 24, or the config's [runtime] max_executions)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="worker processes on the one port, each owning a share of the workspaces "
        '(default: 1, or the config\'s [server] workers; docs/operations.md, "Workers")',
    )
    # Set by the supervisor of --workers on the command line of each worker it starts.
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-node", default=None, help=argparse.SUPPRESS)
    add_data_args(parser)
    add_config_arg(parser)
    parser.set_defaults(func=serve_command)


async def serve_command(args: argparse.Namespace) -> int:
    """Run the hub; 0 after a clean shutdown, 2 for bad configuration or a bind failure,
    :data:`EXIT_FENCED` when the other nodes of its cluster declared it dead."""
    # Imported here so that `agora --help` does not pull in websockets and the store drivers.
    from hub.log.factory import open_store
    from hub.observe.tracing import Tracing, provider_for
    from hub.server.app import Hub
    from hub.server.supervisor import socket_dir
    from hub.server.workers import WorkerRole, writer_socket

    configure_logging(args.log_format)
    try:
        tracing = Tracing(provider_for(args.traces))
    except ImportError as e:
        return fail("serve", str(e))
    try:
        config = with_cluster_env(config_from_args(args), os.environ)
        if args.a2a_grpc_port is not None:  # the A2A gRPC binding (docs/a2a.md)
            grpc_a2a = msgspec.structs.replace(config.a2a, grpc_port=args.a2a_grpc_port)
            config = msgspec.structs.replace(config, a2a=grpc_a2a)
        if args.workers is not None:
            config = config.with_overrides(source="--workers", workers=args.workers)
        data_dir = config.storage.data_dir
        secret = load_or_create_secret(data_dir, os.environ)
        given_secret = os.environ.get(SECRET_ENV)  # for the workers (see _supervise)
        # Read once: gone from the environment, so no child (a backend's program, a compiler,
        # the Docker CLI) can inherit it.
        os.environ.pop(SECRET_ENV, None)
        signer = TokenSigner(secret, max_ttl=config.auth.max_token_ttl)
        # The checkpoint key, created (0600) at first start; `agora checkpoint key` prints it.
        checkpoint_key = load_or_create_key(data_dir, config.audit.hub_id)
        handoff = None  # a worker on SQLite hands its writes to the supervisor
        if config.server.workers > 1 and args.worker_index is not None:
            handoff = writer_socket(socket_dir(data_dir, config.server.workers))
        store = open_store(config.storage.store, data_dir, handoff=handoff)
    except AgoraError as e:
        return fail("serve", e)
    except OSError as e:
        return fail("serve", f"cannot use the data directory: {e}")

    # Backend instances start in the background (the banner does not wait for Docker).
    if args.max_executions is not None and args.max_executions < 1:
        return fail("serve", "--max-executions must be >= 1")
    # The runtime's settings, built once: [runtime] of agora.toml, the command line over it,
    # and the documented environment override of the rust backend's cache (AGORA_RUST_CACHE).
    settings = config.runtime
    runtime = msgspec.structs.replace(
        settings,
        eager_start=True,
        max_executions=args.max_executions or settings.max_executions,
        rust=settings.rust.resolved(os.environ),
    )
    workers = config.server.workers
    role: WorkerRole | None = None
    try:
        if workers > 1:
            directory = socket_dir(data_dir, workers)
            if args.worker_index is None:
                directory.mkdir(mode=0o700, exist_ok=True)
            else:
                if not 0 <= args.worker_index < workers:
                    return fail("serve", "--worker-index must be below --workers")
                role = WorkerRole(
                    index=args.worker_index,
                    count=workers,
                    socket_dir=directory,
                    node=args.worker_node,
                )
        hub = Hub(
            config,
            store,
            signer,
            runtime=runtime,
            checkpoint_key=checkpoint_key,
            tracing=tracing,
            worker=role,
        )
    except AgoraError as e:
        return fail("serve", e)
    except OSError as e:
        return fail("serve", f"cannot use the data directory: {e}")
    if workers > 1 and role is None:
        try:
            return await _supervise(hub, config, args, given_secret)
        finally:
            await tracing.aclose()

    def ready(url: str) -> None:
        print(f"agora serving {url} (data {data_dir})", flush=True)
        if role is not None:
            hub.spawn(_until_orphaned(os.getppid(), stop), name="agora-parent-watch")
        if not args.no_http:  # the HTTP port, same loop, same Workspaces (hub.http)
            hub.spawn(
                _serve_http(hub, signer, config, stop, a2a=not args.no_a2a), name="agora-http"
            )

    try:
        with _stopped_by_signals() as stop:
            await hub.run(stop, on_ready=ready)
    except AgoraError as e:
        return fail("serve", e)
    except OSError as e:
        return fail("serve", f"cannot listen on {config.server.host}:{config.server.port}: {e}")
    finally:
        await tracing.aclose()
    if hub.fenced:
        logging.getLogger("agora.server").error(
            "stopped: this node was declared dead by the other nodes (exit %d: start it again)",
            EXIT_FENCED,
        )
        return EXIT_FENCED
    logging.getLogger("agora.server").info("stopped")
    return 0


async def _supervise(
    hub: Hub, config: HubConfig, args: argparse.Namespace, given_secret: str | None
) -> int:
    """``--workers N``: recover once, reserve the port, on SQLite serve the file's writes
    (hub.log.handoff), run the workers (hub.server.supervisor)."""
    from hub.cluster.settings import resolve_node_id
    from hub.log.factory import open_store
    from hub.log.handoff import HandoffServer
    from hub.log.sqlite import SqliteEventStore
    from hub.server.reaper import WorkerReaper
    from hub.server.supervisor import Supervisor, reserve_port, socket_dir
    from hub.server.workers import writer_socket

    server = config.server
    try:
        await hub.recover_for_workers()
    except AgoraError as e:
        return fail("serve", e)
    try:
        reserved = reserve_port(server.host, server.port)
    except OSError as e:
        return fail("serve", f"cannot listen on {server.host}:{server.port}: {e}")
    env = dict(os.environ)
    if given_secret is not None:
        env[SECRET_ENV] = given_secret  # only in the workers' environment (they remove it)
    async with contextlib.AsyncExitStack() as stack:
        reaper: WorkerReaper | None = None
        if isinstance(hub.store, SqliteEventStore):
            # The file's one writer (hub.log.handoff): the workers hand it their writes, and
            # the reaper writes through it too. On PostgreSQL each worker is a cluster node,
            # writes the database itself, and the cluster reaps it.
            store = open_store(config.storage.store, config.storage.data_dir)
            assert isinstance(store, SqliteEventStore)
            directory = socket_dir(config.storage.data_dir, server.workers)
            handoff = HandoffServer(store, writer_socket(directory))
            try:
                await stack.enter_async_context(store)
                await stack.enter_async_context(handoff)
            except AgoraError as e:
                return fail("serve", e)
            except OSError as e:
                return fail("serve", f"cannot serve the workers' writes: {e}")
            closed_by = resolve_node_id(config.cluster)
            reaper = WorkerReaper(store, config.limits, closed_by, handoff)
        supervisor = Supervisor(
            count=server.workers,
            argv=args.command_argv,
            env=env,
            host=server.host,
            port=reserved.getsockname()[1],
            http=not args.no_http,
            banner_data=config.storage.data_dir,
            reaper=reaper,
        )
        with _stopped_by_signals() as stop, reserved:
            code = await supervisor.run(stop)
    logging.getLogger("agora.server").info("stopped")
    return code


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[asyncio.Event]:
    """An event that SIGTERM and SIGINT set while inside (their handlers go on the way out):
    what stops a hub, a worker and a supervisor alike."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


async def _until_orphaned(parent: int, stop: asyncio.Event) -> None:
    """A worker stops when its supervisor is gone (killed with SIGKILL, it could not stop
    its workers): it would otherwise serve on, holding the port, with nobody restarting it."""
    while not stop.is_set():
        if os.getppid() != parent:
            logging.getLogger("agora.server").warning("the supervisor is gone; stopping")
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), ORPHAN_CHECK_S)


def with_cluster_env(config: HubConfig, env: Mapping[str, str]) -> HubConfig:
    """``config`` with the ``[cluster]`` keys that :data:`CLUSTER_ENV` variables set in ``env``
    replaced. Raises :class:`ConfigError` naming the variable (not a number, out of range,
    a bad node id, a heartbeat not below the timeout)."""
    given = {name: env[name] for name in CLUSTER_ENV if env.get(name)}
    if not given:
        return config
    values: dict[str, Any] = {}
    for name, text in given.items():
        key = CLUSTER_ENV[name]
        if key in ("node_id", "url"):
            values[key] = text
            continue
        if key == "owners":
            flag = text.strip().lower()
            if flag not in _FLAGS:
                raise ConfigError(f"{name} must be true or false, not {text!r}", source=name)
            values[key] = _FLAGS[flag]
            continue
        try:
            values[key] = float(text)
        except ValueError:
            raise ConfigError(
                f"{name} must be a number of seconds, not {text!r}", source=name
            ) from None
    source = "environment (" + ", ".join(given) + ")"
    return config.with_overrides(source=source, **values)


def _load_doors(a2a: bool) -> None:
    """Import the HTTP doors' modules (blocking: run in a thread)."""
    for name in ("hub.http.serve", "hub.mcp.http", "hub.viewer", *(("a2a_adapter.app",) * a2a)):
        importlib.import_module(name)


async def _serve_http(
    hub: Hub, signer: TokenSigner, config: HubConfig, stop: asyncio.Event, *, a2a: bool
) -> None:
    # The doors' modules load in a thread, not on the loop: the MCP SDK alone takes a second,
    # and a node held that long misses its beats (peers declare it dead after [cluster]
    # timeout_s) while its clients wait; nor before the loop, which delays the first banner.
    await asyncio.to_thread(_load_doors, a2a)
    from hub.http.serve import serve_http

    def ready(url: str) -> None:
        # The second banner line; with A2A it keeps its old words (scripts read them).
        print(f"agora {'A2A' if a2a else 'HTTP'} on {url}", flush=True)

    try:
        await serve_http(hub, signer, config, stop, a2a=a2a, on_ready=ready)
    except OSError as e:  # the WebSocket hub keeps serving without HTTP
        logging.getLogger("agora.server").error("HTTP listener not started: %s", e)
    except Exception:  # Hub.spawn: must not raise
        logging.getLogger("agora.server").exception("HTTP listener failed")
