"""From the wire's ``exec`` to the backend's request, once (docs/execution.md, "Runtime").

The ``exec`` frame (:class:`hub.core.wire.frames.Exec`, also what the A2A adapter builds from an
``agora.exec`` part) is the one request type that reaches the runtime;
:func:`execution_request` turns it into the one request type a backend sees
(:class:`hub.core.execution.request.ExecutionRequest`), after the checks that need the backend
instance: the language, source or module, ``input`` only where the backend runs a callable
language, and the policy narrowed from the instance's defaults. :func:`requested_payload` is
what the log keeps of it (``execRequested``: environment names, never values).
"""

from __future__ import annotations

from typing import Final

import msgspec

from backends.base import (
    ExecutionLanguage,
    ExecutionPayload,
    ExecutionRequest,
    GuestModule,
    ModuleBlob,
    Source,
    narrow,
)
from hub.core.errors import BadRequest
from hub.core.events import ExecModuleRef, ExecRequestedPayload
from hub.core.validation import validate_sha256
from hub.core.wire.frames import Exec
from hub.runtime.registry import BackendInstance

__all__ = ["PreparedRequest", "execution_request", "requested_payload"]

_LANGUAGES: Final = ", ".join(sorted(lang.value for lang in ExecutionLanguage))


class PreparedRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The backend's request, and what the log needs beside it: the module as logged (a blob
    reference) or the inline module bytes still to be stored, and the output encoding."""

    request: ExecutionRequest
    logged_module: ExecModuleRef | None = None
    module_bytes: bytes | None = None
    encoding: str | None = None


def _language(frame: Exec, instance: BackendInstance) -> ExecutionLanguage:
    if frame.language is None:
        return ExecutionLanguage.WASM if frame.module is not None else instance.default_language
    try:
        return ExecutionLanguage(frame.language)
    except ValueError:
        raise BadRequest(
            f"unknown language {frame.language!r} (use one of {_LANGUAGES})", field="language"
        ) from None


def execution_request(
    instance: BackendInstance, frame: Exec, exec_id: str, agent: str
) -> PreparedRequest:
    """The request for ``frame`` on ``instance`` as execution ``exec_id`` of ``agent``.
    Raises ``BadRequest`` (source and module, unknown language, ``input`` on a backend that
    runs no callable language, an invalid field), ``Rejected`` (a policy wider than the
    instance's)."""
    if frame.source is not None and frame.module is not None:
        raise BadRequest("exec takes source or module, not both", field="module")
    language = _language(frame, instance)
    payload: ExecutionPayload
    logged: ExecModuleRef | None = None
    module_bytes: bytes | None = None
    if isinstance(frame.module, bytes):
        module_bytes = frame.module
        payload = GuestModule(module_bytes)
    elif frame.module is not None:
        sha = validate_sha256(frame.module.blob, "module.blob")
        payload = ModuleBlob(sha)
        logged = ExecModuleRef(blob=sha)
    else:
        payload = Source(frame.source or "")
    # ``input: null`` on the wire is "no input", like an omitted one.
    value = msgspec.UNSET if frame.input is None else frame.input
    if value is not msgspec.UNSET and not instance.callable:
        raise BadRequest(
            f"backend {instance.id!r} is not callable: input is only for backends that "
            "run callable languages",
            field="input",
            backend=instance.id,
        )
    policy = narrow(instance.backend.default_policy, frame.policy)
    try:
        request = ExecutionRequest(
            exec_id=exec_id,
            language=language,
            payload=payload,
            argv=tuple(frame.argv),
            stdin=frame.stdin,
            input=value,
            env=dict(frame.env),
            cwd=frame.cwd,
            timeout_ms=frame.timeout_ms,
            policy=policy,
            identity=agent,
        )
    except (TypeError, ValueError, msgspec.ValidationError) as e:
        raise BadRequest(f"invalid exec request: {e}") from e
    return PreparedRequest(
        request=request, logged_module=logged, module_bytes=module_bytes, encoding=frame.encoding
    )


def requested_payload(
    prepared: PreparedRequest, backend: str, module: ExecModuleRef | None, node: str
) -> ExecRequestedPayload:
    """The ``execRequested`` payload (``module``: the logged reference, the inline bytes once
    stored; ``node``: the hub node accepting it, which will run it). Environment values may
    be secrets: only the names are logged."""
    request = prepared.request
    return ExecRequestedPayload(
        exec_id=request.exec_id,
        backend=backend,
        language=request.language.value,
        source=request.source,
        module=module,
        argv=list(request.argv),
        stdin=request.stdin,
        input=request.input if request.has_input else None,
        env_keys=sorted(request.env),
        cwd=request.cwd,
        timeout_ms=request.timeout_ms,
        encoding=prepared.encoding,
        policy=msgspec.to_builtins(request.policy),
        node=node,
    )
