"""Validation of names, paths, ids and drafts (hub/core/validation.py)."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings

from hub.core.errors import BadRequest, TooLarge
from hub.core.events import (
    ArtifactPayload,
    ArtifactPublished,
    Event,
    FileDeleted,
    FileDeletedPayload,
    FileMoved,
    FileMovedPayload,
    FileWritten,
    FileWrittenPayload,
    MessagePayload,
    MessagePosted,
    NeedWork,
)
from hub.core.validation import (
    MAX_PATH_BYTES,
    Limits,
    check_event_bounds,
    check_event_size,
    file_content,
    validate_draft,
    validate_id,
    validate_path,
    validate_workspace,
)
from tests.strategies import valid_drafts

SHA = "a" * 64


@pytest.mark.parametrize(
    "path",
    [
        "a",
        "a.txt",
        "src/main.py",
        "a/b/c/d",
        ".hidden",
        "a/.b",
        "..a",
        "a..",
        "dir with space/é.txt",
        "x" * MAX_PATH_BYTES,
        "é" * (MAX_PATH_BYTES // 2),
    ],
)
def test_good_paths(path: str) -> None:
    assert validate_path(path) == path


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "non-empty"),
        ("a/../b", "normalised"),
        ("..", "normalised"),
        ("../a", "normalised"),
        ("/abs", "relative"),
        ("/", "relative"),
        ("a//b", "normalised"),
        ("./a", "normalised"),
        ("a/./b", "normalised"),
        ("a/", "normalised"),
        ("a\x00b", "NUL"),
        ("x" * (MAX_PATH_BYTES + 1), "longer"),
        ("é" * (MAX_PATH_BYTES // 2) + "x", "longer"),  # 1025 bytes, 513 characters
    ],
)
def test_bad_paths(path: str, why: str) -> None:
    with pytest.raises(BadRequest, match=why) as info:
        validate_path(path, "payload.path")
    assert info.value.details == {"field": "payload.path"}


@pytest.mark.parametrize("name", ["ws", "a", "A-b_c.9", "x" * 128, "..a", ".a"])
def test_good_workspace_names(name: str) -> None:
    assert validate_workspace(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a b", "x" * 129, "é", "a\x00", "a:b"])
def test_bad_workspace_names(name: str) -> None:
    with pytest.raises(BadRequest) as info:
        validate_workspace(name)
    assert info.value.details["field"] == "workspace"
    assert info.value.code == "badRequest"


def test_ids() -> None:
    assert validate_id("x" * 256, "id") == "x" * 256
    for bad in ("", "x" * 257, "a\nb", "\x00"):
        with pytest.raises(BadRequest):
            validate_id(bad, "id")
    with pytest.raises(BadRequest) as info:
        validate_draft(NeedWork(correlation_id="a\tb"))
    assert info.value.details["field"] == "correlationId"


def _written(**kw: object) -> FileWritten:
    return FileWritten(payload=FileWrittenPayload(path="f.txt", **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "sources",
    [
        {},
        {"text": "a", "base64": "YQ=="},
        {"text": "a", "blob": SHA},
        {"base64": "YQ==", "blob": SHA},
        {"text": "a", "base64": "YQ==", "blob": SHA},
    ],
)
def test_file_written_needs_exactly_one_source(sources: dict[str, str]) -> None:
    with pytest.raises(BadRequest, match="exactly one") as info:
        validate_draft(_written(**sources))
    assert info.value.details["field"] == "payload"


@pytest.mark.parametrize("bad", ["not base64!", "YQ=", "YQ==\n", "Y", "YQ==YQ=="])
def test_bad_base64(bad: str) -> None:
    with pytest.raises(BadRequest, match="base64") as info:
        validate_draft(_written(base64=bad))
    assert info.value.details["field"] == "payload.base64"


def test_good_file_written() -> None:
    for kw in (
        {"text": ""},
        {"text": "héllo"},
        {"base64": base64.b64encode(b"\xff").decode()},
        {"blob": SHA},
        {"text": "x", "base_rev": 0},
    ):
        validate_draft(_written(**kw))


def test_bad_blob_and_base_rev() -> None:
    with pytest.raises(BadRequest, match="sha256"):
        validate_draft(_written(blob="ABC"))
    with pytest.raises(BadRequest, match="baseRev"):
        validate_draft(_written(text="x", base_rev=-1))
    with pytest.raises(BadRequest, match="baseRev"):
        validate_draft(FileDeleted(payload=FileDeletedPayload(path="a", base_rev=-2)))


def test_file_too_large() -> None:
    limits = Limits(max_file_bytes=4)
    validate_draft(_written(text="abcd"), limits)
    with pytest.raises(TooLarge) as info:
        validate_draft(_written(base64=base64.b64encode(b"abcde").decode()), limits)
    assert info.value.details["limit"] == 4


def test_moves_and_deletes_validate_paths() -> None:
    with pytest.raises(BadRequest) as info:
        validate_draft(FileMoved(payload=FileMovedPayload(from_="a", to="/b")))
    assert info.value.details["field"] == "payload.to"
    with pytest.raises(BadRequest) as info:
        validate_draft(FileMoved(payload=FileMovedPayload(from_="a/../b", to="c")))
    assert info.value.details["field"] == "payload.from"
    with pytest.raises(BadRequest, match="same"):
        validate_draft(FileMoved(payload=FileMovedPayload(from_="a", to="a")))
    with pytest.raises(BadRequest):
        validate_draft(FileDeleted(payload=FileDeletedPayload(path="./a")))


def test_artifacts() -> None:
    ok = ArtifactPayload(key="report", blob=SHA, sha256=SHA, size_bytes=3)
    validate_draft(ArtifactPublished(payload=ok))
    with pytest.raises(BadRequest):
        validate_draft(ArtifactPublished(payload=ArtifactPayload(key="")))
    with pytest.raises(BadRequest):
        validate_draft(ArtifactPublished(payload=ArtifactPayload(key="k", blob="nothex")))
    with pytest.raises(BadRequest):
        validate_draft(ArtifactPublished(payload=ArtifactPayload(key="k", size_bytes=-1)))


def test_file_content_decodes() -> None:
    assert file_content("é", None, "f") == "é".encode()
    assert file_content(None, "YWI=", "f") == b"ab"
    assert file_content(None, None, "f") == b""


@settings(max_examples=100)
@given(valid_drafts(max_size=30))
def test_generated_drafts_are_valid(drafts: list[tuple[str, Event]]) -> None:
    for _, draft in drafts:
        assert validate_draft(draft) is draft


def test_messages_pass() -> None:
    validate_draft(MessagePosted())


# -- characters, media types, nesting (issue 11) -----------------------------------------------

UNSAFE = ["\r", "\n", "\t", "\x1b", "\x7f", "\x85", "\x9b", "\u202a", "\u202e", "\u2066", "\u2069"]


@pytest.mark.parametrize("char", UNSAFE)
def test_paths_and_ids_refuse_control_and_bidi_characters(char: str) -> None:
    with pytest.raises(BadRequest) as info:
        validate_path(f"src/a{char}b.py", "payload.path")
    assert info.value.details["field"] == "payload.path"
    with pytest.raises(BadRequest):
        validate_id(f"agent{char}x", "producer")


def test_paths_and_ids_keep_other_unicode() -> None:
    assert validate_path("docs/résumé ✓/日本.md") == "docs/résumé ✓/日本.md"
    assert validate_id("agent-ü", "producer") == "agent-ü"


@pytest.mark.parametrize(
    "bad", ["zz", "text/", "/plain", "text/plain\n", "a b/c", "x/" + "y" * 300]
)
def test_artifact_media_type_is_checked(bad: str) -> None:
    draft = ArtifactPublished(payload=ArtifactPayload(key="k", media_type=bad))
    with pytest.raises(BadRequest) as info:
        validate_draft(draft)
    assert info.value.details["field"] == "payload.mediaType"


@pytest.mark.parametrize("good", ["image/png", "application/json; charset=utf-8", "image/svg+xml"])
def test_artifact_media_types_accepted(good: str) -> None:
    validate_draft(ArtifactPublished(payload=ArtifactPayload(key="k", media_type=good)))


def test_a_payload_nested_deeper_than_the_limit_is_refused() -> None:
    deep: object = []
    for _ in range(2000):  # deeper than any recursive walk survives
        deep = [deep]
    with pytest.raises(BadRequest) as info:
        validate_draft(MessagePosted(payload=MessagePayload(data=deep)))
    assert info.value.details == {"field": "payload", "limit": 64}
    shallow: object = []
    for _ in range(10):
        shallow = [shallow]
    validate_draft(MessagePosted(payload=MessagePayload(data={"a": shallow})))
    with pytest.raises(BadRequest):
        validate_draft(MessagePosted(payload=MessagePayload(data=shallow)), Limits(max_depth=5))
    with pytest.raises(BadRequest):  # an untyped payload (a kind whose payload is Any) too
        validate_draft(NeedWork(payload={"spec": deep}))


@pytest.mark.parametrize("depth", [0, 1, 5, 6, 7, 64, 65, 2000])
def test_event_bounds_are_the_depth_and_size_checks_in_one(depth: int) -> None:
    # check_event_bounds (one encoding: the event is one level deeper than its payload)
    # refuses exactly what validate_draft's payload check and check_event_size refuse.
    data: object = "x"
    for _ in range(depth):
        data = [data]
    for limits in (Limits(max_depth=5), Limits(), Limits(max_event_bytes=1024)):
        for draft in (
            MessagePosted(payload=MessagePayload(text="t" * 900, data=data)),
            NeedWork(payload={"spec": data}),
            NeedWork(),
        ):
            expected: type[Exception] | None = None
            try:
                validate_draft(draft, limits)
                check_event_size(draft, limits)
            except (BadRequest, TooLarge) as e:
                expected = type(e)
                details = e.details
            validate_draft(draft, limits, depth=False)  # leaves the nesting to the caller
            if expected is None:
                check_event_bounds(draft, limits)
                continue
            with pytest.raises(expected) as info:
                check_event_bounds(draft, limits)
            assert info.value.details == details
