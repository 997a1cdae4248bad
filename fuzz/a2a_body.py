"""Fuzz target: the A2A door's body parsing (a2a_adapter.limits + the SDK's JSON-RPC parse).

For any body: the depth check answers without raising; a body it passes is parsed by
``json.loads`` and, for a JSON-RPC ``SendMessage``, by protobuf's ``ParseDict`` and the SDK's
required-field validation exactly as the SDK's dispatcher does — and none of them may hit a
``RecursionError`` (the failure that used to answer -32603 and log a traceback). Other parse
errors are the expected refusals. Run by ``scripts/fuzz``.
"""

from __future__ import annotations

import json
import sys

import atheris

with atheris.instrument_imports():
    from a2a.server.request_handlers.request_handler import validate_proto_required_fields
    from a2a.types.a2a_pb2 import SendMessageRequest
    from google.protobuf.json_format import ParseDict

    from hub.core.decoding import json_too_deep

MAX_DEPTH = 64


def test_one_input(data: bytes) -> None:
    if json_too_deep(data, MAX_DEPTH):
        return  # refused at the door: -32700 / 400, nothing parsed
    try:
        body = json.loads(data)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError: the SDK's parse error
        return
    if not isinstance(body, dict) or not isinstance(body.get("params"), dict):
        return
    try:
        request = ParseDict(body["params"], SendMessageRequest(), ignore_unknown_fields=True)
        validate_proto_required_fields(request)
    except RecursionError:
        raise
    except Exception:  # the SDK maps these to InvalidParams (-32602)
        return


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
