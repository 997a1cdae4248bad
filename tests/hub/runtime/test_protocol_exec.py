"""The exec ops in the pure protocol session (hub.core.wire.session): decoding, rights (the ``exec``
right and the token's backends, the default backend included), the bound on waiting requests,
and the reply frames. Plain values: no sockets, no loop."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from hub.core.capability import Capability
from hub.core.errors import BadRequest, NotFound
from hub.core.wire.frames import ExecEnd, ExecResult, Killed, RuntimeResult
from hub.core.wire.session import (
    DisposeRequest,
    ExecRequest,
    ExecResultRequest,
    GetExecRequest,
    KillRequest,
    Send,
    ServerSession,
    SessionLimits,
    encode_exec_event_frame,
    encode_frame,
)

NOW = 1_800_000_000.0


def capability(
    rights: tuple[Any, ...] = ("read", "exec"), backends: tuple[str, ...] = ("process",)
) -> Capability:
    return Capability(
        agent="alice",
        workspaces=("*",),
        rights=rights,
        backends=backends,
        expires_at=int(NOW) + 3600,
        issued_at=int(NOW),
        token_id="t",
    )


def session(
    cap: Capability, default_backend: str | None = "process", waits: int = 64
) -> ServerSession:
    s = ServerSession(
        lambda _token: cap,
        clock=lambda: NOW,
        default_backend=default_backend,
        limits=SessionLimits(max_exec_waits=waits),
    )
    s.receive(json.dumps({"op": "hello", "token": "x"}))
    return s


def frame(actions: list[Any]) -> dict[str, Any]:
    assert len(actions) == 1 and isinstance(actions[0], Send), actions
    out: dict[str, Any] = json.loads(encode_frame(actions[0].frame))
    return out


def send(s: ServerSession, **fields: Any) -> list[Any]:
    return s.receive(json.dumps(fields))


def test_exec_is_routed_with_the_default_backend() -> None:
    s = session(capability())
    (request,) = send(s, op="exec", rid=1, workspace="w", source="echo", input={"a": 1})
    assert isinstance(request, ExecRequest)
    assert request.frame.backend == "process" and request.frame.input == {"a": 1}
    (no_input,) = send(s, op="exec", rid=2, workspace="w", source="echo")
    assert no_input.frame.input is msgspec.UNSET  # omitted, not null
    accepted = s.completed(request, "x1")
    assert frame(accepted) == {"op": "execAccepted", "rid": 1, "workspace": "w", "execId": "x1"}


@pytest.mark.parametrize(
    ("cap", "fields", "code", "detail"),
    [
        (capability(rights=("read",)), {}, "forbidden", ("right", "exec")),
        (capability(backends=("ro",)), {}, "forbidden", ("backend", "process")),
        (capability(backends=("ro",)), {"backend": "process"}, "forbidden", ("backend", "process")),
        (capability(backends=("*",)), {"bogus": 1}, "badRequest", ("field", "$.bogus")),
        (capability(), {"policy": {"network": "on"}}, "badRequest", None),
        (capability(), {"timeoutMs": 0}, "badRequest", ("field", "$.timeoutMs")),
    ],
)
def test_exec_refusals(
    cap: Capability, fields: dict[str, Any], code: str, detail: tuple[str, str] | None
) -> None:
    s = session(cap)
    error = frame(send(s, op="exec", rid=1, workspace="w", source="true", **fields))
    assert (error["op"], error["code"]) == ("error", code), error
    if detail is not None:
        assert error["details"][detail[0]] == detail[1]


def test_no_backend_at_all_is_not_found() -> None:
    error = frame(send(session(capability(), default_backend=None), op="exec", workspace="w"))
    assert error["code"] == NotFound.code


def test_read_ops_need_read_and_write_ops_need_exec() -> None:
    reader = session(capability(rights=("read",)))
    (result,) = send(reader, op="execResult", rid=1, workspace="w", execId="x")
    (stream,) = send(reader, op="getExec", rid=2, workspace="w", execId="x", resume=3)
    assert isinstance(result, ExecResultRequest) and isinstance(stream, GetExecRequest)
    assert stream.resume == 3
    for op in ("kill", "dispose"):
        error = frame(send(reader, op=op, rid=3, workspace="w", execId="x"))
        assert (error["code"], error["details"]["right"]) == ("forbidden", "exec")
    s = session(capability())
    kinds = [
        type(a[0]) for a in (send(s, op=o, workspace="w", execId="x") for o in ("kill", "dispose"))
    ]
    assert kinds == [KillRequest, DisposeRequest]
    bad = frame(send(s, op="getExec", workspace="w", execId="x", resume="middle"))
    assert bad["code"] == BadRequest.code


def test_waiting_requests_are_bounded_per_connection() -> None:
    s = session(capability(), waits=2)
    first = send(s, op="execResult", rid=1, workspace="w", execId="a")[0]
    send(s, op="kill", rid=2, workspace="w", execId="b")
    busy = frame(send(s, op="getExec", rid=3, workspace="w", execId="c"))
    assert (busy["code"], busy["details"]["limit"]) == ("busy", 2)
    result = RuntimeResult(
        status="completed",
        reason="exit",
        exit_code=0,
        stdout="",
        stderr="",
        encoding="utf8",
        stdout_truncated=False,
        stderr_truncated=False,
        duration_ms=1,
        pushed=0,
        pulled=0,
        skipped=[],
    )
    done = s.completed(first, result)
    assert isinstance(done[0], Send) and isinstance(done[0].frame, ExecResult)
    assert s.exec_waits == 1
    (stream,) = send(s, op="getExec", rid=4, workspace="w", execId="c")
    (end,) = s.completed(stream, "cancelled")
    assert isinstance(end, Send) and isinstance(end.frame, ExecEnd)
    assert end.frame.status == "cancelled"
    s.failed(stream, NotFound("gone"))  # a failure releases its slot too (never below 0)
    assert s.exec_waits == 0


def test_replies_and_the_event_frame() -> None:
    s = session(capability())
    (kill,) = send(s, op="kill", rid="k", workspace="w", execId="x")
    (reply,) = s.completed(kill, "cancelled")
    assert isinstance(reply, Send) and isinstance(reply.frame, Killed)
    assert (reply.frame.status, reply.frame.rid) == ("cancelled", "k")
    data = encode_exec_event_frame(7, "w", "x", b'{"kind":"execOutput","seq":3}', "hi")
    assert json.loads(data) == {
        "op": "execEvent",
        "rid": 7,
        "workspace": "w",
        "execId": "x",
        "event": {"kind": "execOutput", "seq": 3},
        "text": "hi",
    }
