"""A2A push notifications: configs per task, webhook calls on task state changes.

A client creates a ``TaskPushNotificationConfig`` for a task (``CreateTaskPushNotificationConfig``,
or ``configuration.taskPushNotificationConfig`` of a ``SendMessage``). From then on every change
of the task's state is POSTed to the config's URL as a ``StreamResponse`` (``{"statusUpdate":
…}``, the same JSON a stream carries), with ``X-A2A-Notification-Token: <token>`` and
``Authorization: <scheme> <credentials>`` when the config has them — and nothing else of the hub
(no hub token, no cookie). Each attempt is a ``pushAttempted`` event in the task's workspace.

Webhook URLs are attacker-supplied, so (:class:`UrlPolicy`):

- http(s) only, no user info, at most 2048 characters;
- the host is resolved (off the event loop: ``getaddrinfo``) and *every* address must be
  allowed by ``[a2a.push]`` (globally routable ones with ``allow_public``, loopback only with
  ``allow_loopback``, others only inside ``allowed_networks``); the request then goes to the
  checked address (the ``Host`` header and TLS SNI name the host), so a DNS answer that changes
  between check and connect cannot redirect it;
- checked when the config is created (a name that does not resolve yet is accepted) and
  again before each delivery (where it must resolve);
- redirects are not followed, the response body is not read, each attempt has a timeout;
- at most ``max_attempts`` attempts with exponential backoff (``backoff_s``, doubling) for
  network errors, 408, 429 and 5xx; any other status ends the delivery;
- at most ``max_configs_per_task`` configs per task and ``max_configs`` in all (configs of
  ended tasks are dropped first when the total is reached);
- a config lives no longer than its creator's token: once expired or revoked, nothing more is
  sent (``refused``).

Configs are held in memory (they carry the client's credentials, which must not enter the
shared log): a hub restart forgets them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Literal
from urllib.parse import urlsplit, urlunsplit

import httpx
from a2a.types.a2a_pb2 import (
    ListTaskPushNotificationConfigsResponse,
    StreamResponse,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError, UnsupportedOperationError
from google.protobuf import json_format

from a2a_adapter.mapping import TERMINAL_STATES
from a2a_adapter.responses import integral
from a2a_adapter.store import LogTaskEventStream, TaskRef
from hub import __version__
from hub.config import PushSettings
from hub.core.backoff import Backoff
from hub.core.capability import Capability
from hub.core.errors import AgoraError
from hub.core.events import PushAttempted, PushAttemptedPayload
from hub.follow import FollowerClosed
from hub.revocations import Revocations
from hub.workspaces import Workspaces

__all__ = [
    "MAX_URL_CHARS",
    "NOTIFICATION_TOKEN_HEADER",
    "PushNotifications",
    "PushRefused",
    "UrlPolicy",
    "retry_backoff",
]

log = logging.getLogger(__name__)

NOTIFICATION_TOKEN_HEADER: Final = "X-A2A-Notification-Token"
MAX_URL_CHARS: Final = 2048
MAX_SECRET_CHARS: Final = 4096  # token, scheme + credentials
MAX_ID_CHARS: Final = 256
_RETRY_STATUS: Final = frozenset({408, 425, 429})

DeliveryOutcome = Literal["delivered", "retry", "failed", "refused"]
"""How one push delivery attempt ended."""
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


def retry_backoff(settings: PushSettings) -> Backoff:
    """The wait between delivery attempts: the one :class:`~hub.core.backoff.Backoff`,
    ``backoff_s`` doubling after each attempt, uncapped within ``max_attempts`` and without
    jitter (the documented schedule, docs/a2a.md)."""
    return Backoff(
        initial=settings.backoff_s,
        maximum=settings.backoff_s * 2.0**settings.max_attempts,
        jitter=0.0,
        give_up_after=None,
    )


class PushRefused(ValueError):
    """A webhook URL the policy does not allow (the message says why)."""


async def _resolve(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """A checked webhook: where to connect and what to call it."""

    url: str  # as configured
    address: str  # the checked IP to connect to
    host: str
    port: int
    scheme: str
    path: str  # path and query, as configured

    @property
    def pinned_url(self) -> httpx.URL:
        return httpx.URL(
            scheme=self.scheme, host=self.address, port=self.port, raw_path=self.path.encode()
        )

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


class UrlPolicy:
    """Which webhook URLs may be called (``[a2a.push]``)."""

    def __init__(self, settings: PushSettings, resolver: Resolver = _resolve) -> None:
        self.settings = settings
        self.networks = tuple(
            ipaddress.ip_network(net, strict=False) for net in settings.allowed_networks
        )
        self._resolve = resolver

    def allows(self, address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in self.networks):
            return True
        if ip.is_loopback:
            return self.settings.allow_loopback
        return self.settings.allow_public and ip.is_global and not ip.is_multicast

    @staticmethod
    def parse(url: str) -> tuple[str, str, int, str]:
        """(scheme, host, port, path+query) of a syntactically acceptable webhook URL."""
        if len(url) > MAX_URL_CHARS:
            raise PushRefused(f"the URL is longer than {MAX_URL_CHARS} characters")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:
            raise PushRefused(f"not a URL: {e}") from e
        if parts.scheme not in ("http", "https"):
            raise PushRefused("the URL must be http:// or https://")
        if parts.username is not None or parts.password is not None:
            raise PushRefused("the URL must not carry user info")
        host = parts.hostname
        if not host:
            raise PushRefused("the URL has no host")
        if port is None:
            port = 443 if parts.scheme == "https" else 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return parts.scheme, host, port, path

    async def check(self, url: str, *, unresolved_ok: bool = False) -> Target | None:
        """The target to call for ``url``. Raises :class:`PushRefused`. ``unresolved_ok``
        (creating a config): a name that does not resolve *now* is accepted (None) — every
        delivery checks again, and nothing is sent to a name that never resolved."""
        scheme, host, port, path = self.parse(url)
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:
            try:
                async with asyncio.timeout(self.settings.timeout_s):
                    addresses = list(await self._resolve(host, port))
            except (OSError, TimeoutError) as e:
                if unresolved_ok:
                    return None
                raise PushRefused(f"cannot resolve {host!r}") from e
        if not addresses:
            if unresolved_ok:
                return None
            raise PushRefused(f"cannot resolve {host!r}")
        refused = [a for a in addresses if not self.allows(a)]
        if refused:
            # One forbidden address is enough to refuse: a name with a public and a private
            # address must not reach the private one on a retry.
            raise PushRefused(f"{host!r} resolves to {refused[0]}, which [a2a.push] does not allow")
        return Target(url, addresses[0], host, port, scheme, path)


def redacted(url: str) -> str:
    """``url`` without query and fragment (which may carry secrets), for the log."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(invalid)"
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    with contextlib.suppress(ValueError):
        if parts.port is not None:
            netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclasses.dataclass(slots=True)
class _Entry:
    config: TaskPushNotificationConfig
    owner: Capability
    created: float


@dataclasses.dataclass(slots=True)
class _Task:
    ref: TaskRef
    configs: dict[tuple[str, str], _Entry] = dataclasses.field(default_factory=dict)
    watcher: asyncio.Task[None] | None = None
    ended: bool = False


class PushNotifications:
    """The configs and their deliveries. :meth:`aclose` stops every delivery."""

    def __init__(
        self,
        workspaces: Workspaces,
        stream: LogTaskEventStream,
        revocations: Revocations,
        settings: PushSettings,
        *,
        policy: UrlPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.workspaces = workspaces
        self.stream = stream
        self.revocations = revocations
        self.settings = settings
        self.policy = policy or UrlPolicy(settings)
        self.backoff = retry_backoff(settings)
        self._clock = clock
        self._tasks: dict[str, _Task] = {}
        self._count = 0
        self._closed = False
        self._client = httpx.AsyncClient(
            follow_redirects=False,
            timeout=httpx.Timeout(settings.timeout_s),
            trust_env=False,  # no proxy or netrc of the hub's environment
            headers={"User-Agent": f"agora-hub/{__version__}"},
        )

    async def aclose(self) -> None:
        self._closed = True
        watchers = [t.watcher for t in self._tasks.values() if t.watcher is not None]
        for watcher in watchers:
            watcher.cancel()
        for watcher in watchers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
        await self._client.aclose()

    # -- configs ----------------------------------------------------------------------------

    async def create(
        self,
        ref: TaskRef,
        task_id: str,
        config: TaskPushNotificationConfig,
        owner: Capability,
        *,
        after_seq: int,
        terminal: bool,
    ) -> TaskPushNotificationConfig:
        """Add (or, same id and owner, replace) a config; deliveries start after ``after_seq``.
        Raises InvalidParamsError (bad or refused URL, oversized fields),
        UnsupportedOperationError (too many configs)."""
        if self._closed:
            raise UnsupportedOperationError(message="the A2A listener is stopping")
        if config.task_id and config.task_id != task_id:
            raise InvalidParamsError(message="the config's taskId is not the task's")
        await self.check(config)
        stored = TaskPushNotificationConfig()
        stored.CopyFrom(config)
        stored.task_id = task_id
        stored.tenant = ""
        if not stored.id:
            stored.id = str(uuid.uuid4())
        task = self._tasks.get(task_id)
        if task is None:
            task = self._tasks[task_id] = _Task(ref)
        key = self._key(owner, stored.id)
        if key not in task.configs:
            if len(task.configs) >= self.settings.max_configs_per_task:
                raise UnsupportedOperationError(
                    message=f"at most {self.settings.max_configs_per_task} push configs per task",
                    data={"agoraCode": "busy"},
                )
            if self._count >= self.settings.max_configs and not self._evict():
                raise UnsupportedOperationError(
                    message="the hub holds as many push configs as it may; retry later",
                    data={"agoraCode": "busy"},
                )
            self._count += 1
        task.configs[key] = _Entry(stored, owner, self._clock())
        if terminal:
            task.ended = True
        elif task.watcher is None or task.watcher.done():
            task.watcher = asyncio.create_task(
                self._watch(task_id, task, after_seq), name=f"a2a-push-{task_id}"
            )
        out = TaskPushNotificationConfig()
        out.CopyFrom(stored)
        return out

    async def check(self, config: TaskPushNotificationConfig) -> None:
        """Raise InvalidParamsError unless ``config`` may be created (fields, URL policy)."""
        self._check_fields(config)
        try:
            await self.policy.check(config.url, unresolved_ok=True)
        except PushRefused as e:
            raise InvalidParamsError(
                message=f"push URL refused: {e}", data={"agoraCode": "forbidden"}
            ) from e

    def get(self, task_id: str, config_id: str, owner: Capability) -> TaskPushNotificationConfig:
        task = self._tasks.get(task_id)
        entry = task.configs.get(self._key(owner, config_id)) if task else None
        if entry is None:
            raise TaskNotFoundError(message=f"no push config {config_id!r} for task {task_id!r}")
        out = TaskPushNotificationConfig()
        out.CopyFrom(entry.config)
        return out

    def list(self, task_id: str, owner: Capability) -> ListTaskPushNotificationConfigsResponse:
        task = self._tasks.get(task_id)
        configs = (
            []
            if task is None
            else [e.config for (agent, _), e in task.configs.items() if agent == owner.agent]
        )
        return ListTaskPushNotificationConfigsResponse(configs=configs)

    def delete(self, task_id: str, config_id: str, owner: Capability) -> None:
        """Remove the config; idempotent (deleting a missing one is no error, as the spec
        wants)."""
        task = self._tasks.get(task_id)
        if task is None or task.configs.pop(self._key(owner, config_id), None) is None:
            return
        self._count -= 1
        if not task.configs:
            if task.watcher is not None:
                task.watcher.cancel()
            del self._tasks[task_id]

    @staticmethod
    def _key(owner: Capability, config_id: str) -> tuple[str, str]:
        # Configs are per agent: another agent neither sees nor replaces them.
        return owner.agent, config_id

    @staticmethod
    def _check_fields(config: TaskPushNotificationConfig) -> None:
        if not config.url:
            raise InvalidParamsError(message="the push config needs a url")
        if len(config.id) > MAX_ID_CHARS:
            raise InvalidParamsError(message=f"push config id longer than {MAX_ID_CHARS}")
        auth = config.authentication
        secret = len(config.token) + len(auth.scheme) + len(auth.credentials)
        if secret > MAX_SECRET_CHARS:
            raise InvalidParamsError(message="push config token/authentication too long")
        for text in (config.token, auth.scheme, auth.credentials):
            if any(c in text for c in "\r\n\0"):
                raise InvalidParamsError(message="push config header values must be one line")
        if auth.scheme and not auth.scheme.replace("-", "").isalnum():
            raise InvalidParamsError(message="authentication.scheme must be a token (RFC 9110)")

    def _evict(self) -> bool:
        """Drop the oldest config of an ended task; False when there is none."""
        ended = [
            (e.created, tid, key)
            for tid, t in self._tasks.items()
            if t.ended
            for key, e in t.configs.items()
        ]
        if not ended:
            return False
        _, tid, key = min(ended)
        task = self._tasks[tid]
        del task.configs[key]
        self._count -= 1
        if not task.configs:
            del self._tasks[tid]
        return True

    # -- delivery ---------------------------------------------------------------------------

    async def _watch(self, task_id: str, task: _Task, after_seq: int) -> None:
        """Deliver each state change after ``after_seq`` to every config of the task, in
        order (one notification's retries delay the next)."""
        last: int | None = None
        try:
            async with contextlib.aclosing(
                self.stream.updates(task.ref, task_id, after_seq)
            ) as updates:
                async for seq, update in updates:
                    if not isinstance(update, TaskStatusUpdateEvent):
                        continue
                    if update.status.state == last:
                        continue
                    last = update.status.state
                    entries = list(task.configs.values())
                    async with asyncio.TaskGroup() as group:
                        for entry in entries:
                            group.create_task(self._deliver_safely(task, entry, seq, update))
                    if last in TERMINAL_STATES:
                        break
        except FollowerClosed:
            return
        except AgoraError:
            log.exception("push notifications for task %s stopped", task_id)
        finally:
            task.ended = task.ended or last in TERMINAL_STATES

    async def _deliver_safely(
        self, task: _Task, entry: _Entry, seq: int, update: TaskStatusUpdateEvent
    ) -> None:
        # One config's failure must not stop the others' deliveries.
        try:
            await self._deliver(task, entry, seq, update)
        except Exception:
            log.exception("push delivery for task %s failed", entry.config.task_id)

    async def _deliver(
        self, task: _Task, entry: _Entry, seq: int, update: TaskStatusUpdateEvent
    ) -> None:
        body = integral(json_format.MessageToDict(StreamResponse(status_update=update)))
        envelope = body.get("statusUpdate", {}).get("metadata", {}).get("agora.event", {})
        cause = envelope.get("id") if isinstance(envelope, dict) else None
        cause = cause if isinstance(cause, str) else None
        state = TaskState.Name(update.status.state)
        attempts = self.settings.max_attempts
        for attempt in range(1, attempts + 1):
            ended = self.revocations.ended(entry.owner)
            if ended is not None:
                await self._record(
                    task,
                    entry,
                    seq,
                    state,
                    attempt,
                    "refused",
                    cause,
                    error=f"the config's token {ended.details.get('reason')}",
                )
                return
            status, error, retry = await self._post(entry.config, body)
            if status is not None and 200 <= status < 300:
                await self._record(task, entry, seq, state, attempt, "delivered", cause, status)
                return
            last = attempt == attempts or not retry
            outcome: DeliveryOutcome = (
                "refused" if status is None and not retry else ("failed" if last else "retry")
            )
            await self._record(task, entry, seq, state, attempt, outcome, cause, status, error)
            if last:
                return
            await asyncio.sleep(self.backoff.delay(attempt - 1))

    async def _post(
        self, config: TaskPushNotificationConfig, body: object
    ) -> tuple[int | None, str | None, bool]:
        """(HTTP status, error, worth retrying) of one attempt."""
        try:
            target = await self.policy.check(config.url)
        except PushRefused as e:
            return None, str(e), False
        assert target is not None  # unresolved_ok is False: a target or PushRefused
        headers = {"Host": target.host_header, "Content-Type": "application/json"}
        if config.token:
            headers[NOTIFICATION_TOKEN_HEADER] = config.token
        auth = config.authentication
        if auth.scheme and auth.credentials:
            headers["Authorization"] = f"{auth.scheme} {auth.credentials}"
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        request = self._client.build_request(
            "POST", target.pinned_url, json=body, headers=headers, extensions=extensions
        )
        try:
            # The body is never read: a webhook cannot make the hub download anything.
            response = await self._client.send(request, stream=True)
            await response.aclose()
        except httpx.TimeoutException:
            return None, "timeout", True
        except httpx.HTTPError as e:
            return None, f"{type(e).__name__}: {e}"[:200], True
        status = response.status_code
        if 200 <= status < 300:
            return status, None, False
        if 300 <= status < 400:
            return status, "redirect (not followed)", False
        return status, f"HTTP {status}", status in _RETRY_STATUS or status >= 500

    async def _record(
        self,
        task: _Task,
        entry: _Entry,
        seq: int,
        state: str,
        attempt: int,
        outcome: DeliveryOutcome,
        cause: str | None,
        status: int | None = None,
        error: str | None = None,
    ) -> None:
        event = PushAttempted(
            causation_id=cause,
            payload=PushAttemptedPayload(
                task_id=entry.config.task_id,
                config_id=entry.config.id,
                url=redacted(entry.config.url),
                seq=seq,
                state=state,
                attempt=attempt,
                outcome=outcome,
                status=status,
                error=error,
            ),
        )
        try:
            await self.workspaces.publish(
                task.ref.workspace, [event], producer=entry.owner.agent, trusted=True
            )
        except AgoraError:
            log.exception("could not record a push attempt for task %s", entry.config.task_id)
