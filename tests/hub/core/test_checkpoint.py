"""hub.core.checkpoint against the signed-note test vector of golang.org/x/mod/sumdb/note
(the reference implementation of c2sp.org/signed-note) and the examples of the C2SP specs;
strict parsing and exact formatting."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.core.checkpoint import (
    COSIGNATURE_V1,
    ED25519,
    Checkpoint,
    NoteError,
    NoteSigner,
    add_signatures,
    cosigned_message,
    format_note,
    generate_signer,
    key_id,
    key_name_for,
    open_checkpoint,
    open_note,
    origin_for,
    parse_checkpoint,
    parse_note,
    parse_signer_key,
    parse_verifier_key,
    sign_checkpoint,
    sign_note,
    verified_by,
)

# golang.org/x/mod/sumdb/note's documented example (note.go, "Example"; note_test.go):
# the signer key, its verifier key, and the note it signs, byte for byte.
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_NOTE = (
    GO_TEXT + "\n— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgK"
    "vqfqdngotpRZb6KE6RyyBwJnAM=\n"
)

# c2sp.org/tlog-checkpoint and tlog-cosignature's example (no keys are published for it, so
# its signatures are parsed and re-formatted, not verified).
C2SP_CHECKPOINT = (
    "example.com/behind-the-sofa\n"
    "20852163\n"
    "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    "\n"
    "— example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/"
    "Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
    "— witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlrDJ"
    "sX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==\n"
)
# c2sp.org/signed-note's own example (a note text with an empty line inside).
C2SP_NOTE = (
    "Ognuno sta solo sul cuor della terra\n"
    "trafitto da un raggio di sole:\n"
    "\n"
    "ed è subito sera.\n"
    "\n"
    "— quasimodo.example/salvatore NnugSzTjtVAewIS+Z/iJhUPeFDkO/5QQ2i5ddnGITLlC+EhfLW9oJKONrM"
    "ouFSQU0xMcXxj99ihAQwaqP3ZekRwNtIc=\n"
)


def test_the_go_vector_signs_byte_for_byte() -> None:
    signer = parse_signer_key(GO_SKEY)
    assert signer.verifier.vkey() == GO_VKEY
    assert signer.skey() == GO_SKEY
    assert sign_note(GO_TEXT, [signer]) == GO_NOTE  # Ed25519 is deterministic


def test_the_go_vector_opens() -> None:
    verifier = parse_verifier_key(GO_VKEY)
    assert verifier.key_id == 0xC74F20A3
    assert open_note(GO_NOTE, [verifier]).text == GO_TEXT
    with pytest.raises(NoteError):
        open_note(GO_NOTE.replace("cryptography", "cryptographY"), [verifier])
    other = generate_signer("PeterNeumann").verifier  # same name, another key and ID
    with pytest.raises(NoteError) as info:
        open_note(GO_NOTE, [other])
    assert info.value.details["reason"] == "unsigned"


def test_the_c2sp_examples_parse_and_format_exactly() -> None:
    note = parse_note(C2SP_CHECKPOINT)
    assert [s.name for s in note.signatures] == [
        "example.com/behind-the-sofa",
        "witness.example.com/w1",
    ]
    assert format_note(note) == C2SP_CHECKPOINT
    checkpoint = parse_checkpoint(note.text)
    assert checkpoint.origin == "example.com/behind-the-sofa"
    assert checkpoint.size == 20852163
    assert checkpoint.body() == note.text
    # The cosignature is key ID || u64 timestamp || 64-byte signature.
    cosignature = note.signatures[1]
    assert len(cosignature.data) == 8 + 64
    assert int.from_bytes(cosignature.data[:8], "big") == 1679315147  # the spec's time line
    poem = parse_note(C2SP_NOTE)
    assert poem.text.endswith("ed è subito sera.\n") and "\n\n" in poem.text
    assert format_note(poem) == C2SP_NOTE


def test_key_id_per_the_spec() -> None:
    signer = parse_signer_key(GO_SKEY)
    public = signer.verifier.public_key
    assert key_id("PeterNeumann", ED25519, public) == 0xC74F20A3
    # A cosigner key of the same bytes has its own ID (type 0x04).
    assert key_id("PeterNeumann", COSIGNATURE_V1, public) != 0xC74F20A3


def test_cosignature_v1_message_and_round_trip() -> None:
    body = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    assert cosigned_message(body, 1679315147) == (
        b"cosignature/v1\ntime 1679315147\n" + body.encode()
    )
    log = generate_signer("agora.hub1")
    witness = generate_signer("witness.example/w1", COSIGNATURE_V1)
    checkpoint = Checkpoint(origin=origin_for("agora.hub1", "ws"), size=7, root=b"\x11" * 32)
    note = parse_note(sign_checkpoint(checkpoint, log))
    cosigned = add_signatures(note, [witness.sign(note.text, timestamp=1700000000)])
    text = format_note(cosigned)
    opened, _ = open_checkpoint(
        text, log.verifier, origin="agora.hub1/ws", witnesses=[witness.verifier]
    )
    assert opened == checkpoint
    assert verified_by(parse_note(text), witness.verifier) == 1700000000
    # A cosignature over another text, or by a key of the wrong type, does not verify.
    forged = text.replace("\n7\n", "\n8\n")
    with pytest.raises(NoteError):
        open_checkpoint(forged, log.verifier)
    with pytest.raises(NoteError):
        stranger = generate_signer("w2", COSIGNATURE_V1).verifier
        open_checkpoint(text, log.verifier, witnesses=[stranger])
    with pytest.raises(NoteError) as info:
        open_checkpoint(text, log.verifier, origin="agora.hub1/other")
    assert info.value.details["reason"] == "origin"


def test_a_bad_signature_by_a_known_key_rejects_the_note() -> None:
    log = generate_signer("agora.hub1")
    witness = generate_signer("w1", COSIGNATURE_V1)
    note = parse_note(sign_note("a\n", [log]))
    wrong = witness.sign("b\n", timestamp=5)  # a valid signature, of another text
    text = format_note(add_signatures(note, [wrong]))
    with pytest.raises(NoteError):
        open_note(text, [log.verifier, witness.verifier])
    assert open_note(text, [log.verifier]).text == "a\n"  # an unknown key is ignored


@pytest.mark.parametrize(
    "bad",
    [
        "no blank line\n— k AAAAAAA=\n",
        "text\n\n",  # no signature
        "text\n\n— k AAAAAAA=",  # no final newline
        "text\n\n- k AAAAAAA=\n",  # not an em dash
        "text\n\n— k+x AAAAAAA=\n",  # plus in the name
        "text\n\n—  AAAAAAA=\n",  # empty name
        "text\n\n— k AAAA\n",  # too short
        "text\n\n— k AAAAAAA\n",  # bad base64
        "text\n\n— k AAAAAA==\n",  # base64 that decodes to under 5 bytes
        "te\x01xt\n\n— k AAAAAAA=\n",  # a control character
        "text\r\n\n— k AAAAAAA=\n",
    ],
)
def test_notes_parse_strictly(bad: str) -> None:
    with pytest.raises(NoteError):
        parse_note(bad)


@pytest.mark.parametrize(
    "bad",
    [
        "origin\n5\n",  # two lines
        "origin\n05\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",  # leading zero
        "origin\n-1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
        "origin\n5\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2=\n",  # not 32 bytes
        "origin\n5\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n\n",  # empty extension
        "\n5\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",  # empty origin
        "origin\n5\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=",  # no final newline
    ],
)
def test_checkpoints_parse_strictly(bad: str) -> None:
    with pytest.raises(NoteError):
        parse_checkpoint(bad)


def test_zero_size_and_extension_lines() -> None:
    empty = "origin\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\next\n"
    checkpoint = parse_checkpoint(empty)
    assert checkpoint.size == 0 and checkpoint.extensions == ("ext",)
    assert checkpoint.body() == empty


@pytest.mark.parametrize(
    "bad",
    [
        "PeterNeumann+c74f20a4+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # wrong ID
        "PeterNeumann+c74f20a3+AhpczQcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # type 0x02
        "PeterNeumann+c74f20a3",
        "Peter Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        "PeterNeumann+C74F20A3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
    ],
)
def test_verifier_keys_parse_strictly(bad: str) -> None:
    with pytest.raises(NoteError):
        parse_verifier_key(bad)


def test_signer_keys_parse_strictly_and_never_echo_the_key() -> None:
    with pytest.raises(NoteError) as info:
        parse_signer_key(GO_SKEY.replace("c74f20a3", "00000000"))
    assert "AYEKFALV" not in info.value.message
    with pytest.raises(NoteError):
        parse_signer_key(GO_VKEY)
    assert "AYEKFALV" not in repr(parse_signer_key(GO_SKEY))


def test_hub_names() -> None:
    assert key_name_for("hub1") == "agora.hub1"
    assert origin_for("agora.hub1", "ws") == "agora.hub1/ws"
    with pytest.raises(NoteError):
        key_name_for("a b")


@given(
    text=st.lists(
        st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=20),
        min_size=1,
        max_size=4,
    ),
    seed=st.binary(min_size=32, max_size=32),
)
def test_format_parse_round_trip(text: list[str], seed: bytes) -> None:
    body = "".join(f"{line}\n" for line in text)
    signed = sign_note(body, [NoteSigner("k.example/x", seed)])
    note = parse_note(signed)
    if "\n\n" not in "\n" + body:  # a body with empty lines still parses to the same text
        assert note.text == body
    assert format_note(note) == signed
    assert base64.b64decode(signed.rsplit(" ", 1)[1])[:4] == note.signatures[0].key_id.to_bytes(
        4, "big"
    )
