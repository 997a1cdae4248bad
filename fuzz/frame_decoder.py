"""Fuzz target: the WebSocket door's frame decoder and session (hub.core.wire.session).

Any bytes, before or after ``hello``, as a text or a binary frame: the session must answer with
actions (an ``error`` frame, a close, a request to run) and never raise. Run by ``scripts/fuzz``:
``python fuzz/frame_decoder.py -max_total_time=60 fuzz/corpus/frame_decoder``.
"""

from __future__ import annotations

import sys
import time

import atheris

with atheris.instrument_imports():
    from hub.core.capability import Capability
    from hub.core.errors import Unauthorized
    from hub.core.wire.session import Send, ServerSession

_CAPABILITY = Capability(
    agent="fuzz",
    workspaces=("*",),
    rights=("read", "write", "exec"),
    backends=("*",),
    expires_at=int(time.time()) + 10**6,
    issued_at=int(time.time()),
    token_id="fuzz",
)


def _verify(token: str) -> Capability:
    if token != "good":
        raise Unauthorized("bad token", reason="invalid_signature")
    return _CAPABILITY


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    authenticated = fdp.ConsumeBool()
    binary = fdp.ConsumeBool()
    frame = fdp.ConsumeBytes(fdp.remaining_bytes())
    session = ServerSession(_verify, server="agora/fuzz")
    if authenticated:
        session.receive('{"op":"hello","token":"good"}')
    actions = session.receive_binary(frame) if binary else session.receive(frame)
    if not actions:
        raise AssertionError("a frame got no answer")
    for action in actions:
        if isinstance(action, Send) and action.frame is None:
            raise AssertionError("a Send without a frame")


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
