"""Tests for ``agora token issue|inspect|revoke|revoked`` through ``hub.cli.main``."""

from __future__ import annotations

import io
import json
import stat
import time
from pathlib import Path

import pytest

from hub.auth import TokenSigner, load_secret
from hub.cli import main
from hub.commands.token import parse_ttl, split_list
from hub.core.capability import SYSTEM_WORKSPACE
from hub.core.errors import BadRequest, Unauthorized


@pytest.fixture(autouse=True)
def no_env_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGORA_SECRET", raising=False)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


def issue(data: Path, *extra: str) -> list[str]:
    return ["token", "issue", "--data", str(data), *extra]


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_issue_prints_one_line_that_verifies(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = issue(
        data,
        "--agent", "alice",
        "--workspace", "w1",
        "--workspace", "w2,w3",
        "--rights", "read, write",
        "--backends", "py,wasm",
        "--ttl", "30m",
    )  # fmt: skip
    code, out, err = run(capsys, argv)
    assert code == 0, err
    assert err == ""
    assert out.endswith("\n") and out.count("\n") == 1
    cap = TokenSigner(load_secret(data, {})).verify(out.strip())
    assert cap.agent == "alice"
    assert cap.workspaces == ("w1", "w2", "w3")
    assert cap.rights == ("read", "write")
    assert cap.backends == ("py", "wasm")
    assert cap.expires_at - cap.issued_at == 30 * 60
    assert stat.S_IMODE((data / "secret").stat().st_mode) == 0o600


def test_issue_defaults(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, issue(data, "--agent", "a", "--workspace", "*", "--rights", "admin"))
    assert code == 0
    cap = TokenSigner(load_secret(data, {})).verify(out.strip())
    assert cap.workspaces == ("*",)
    assert cap.backends == ()  # none unless named
    assert cap.expires_at - cap.issued_at == 3600


def test_issue_reuses_the_secret(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = issue(data, "--agent", "a", "--workspace", "w", "--rights", "read")
    _, first, _ = run(capsys, argv)
    _, second, _ = run(capsys, argv)
    signer = TokenSigner(load_secret(data, {}))
    assert signer.verify(first.strip()).agent == signer.verify(second.strip()).agent == "a"


def test_issue_json(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = issue(
        data, "--agent", "a", "--workspace", "w", "--rights", "exec", "--backends", "*", "--json"
    )
    code, out, _ = run(capsys, argv)
    assert code == 0
    document = json.loads(out)
    capability = document["capability"]
    assert capability["agent"] == "a"
    assert capability["rights"] == ["exec"]
    assert capability["backends"] == ["*"]
    assert capability["expiresAt"] - capability["issuedAt"] == 3600
    verified = TokenSigner(load_secret(data, {})).verify(document["token"])
    assert verified.token_id == capability["tokenId"]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--ttl", "soon"], "invalid ttl 'soon'"),
        (["--ttl", "0"], "invalid ttl"),
        (["--ttl", "-5m"], "invalid ttl"),
        (["--ttl", "53w"], "longer than the maximum of 2592000 seconds"),
        (["--ttl", "31d"], "maximum of 2592000 seconds ([auth] max_token_ttl)"),
        (["--rights", "read,fly"], "unknown right 'fly'"),
        (["--rights", ","], "at least one right"),
        (["--workspace", "bad/name"], "invalid workspace name 'bad/name'"),
        (["--backends", "a b"], "invalid backend id 'a b'"),
        (["--agent", ""], "agent must be 1-256 bytes"),
        (["--agent", "x" * 300], "agent must be 1-256 bytes"),
    ],
)
def test_issue_bad_input(
    data: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragment: str
) -> None:
    args = {"--agent": "a", "--workspace": "w", "--rights": "read"}
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        args[flag] = value
    code, out, err = run(capsys, issue(data, *[f"{k}={v}" for k, v in args.items()]))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("agora token issue: error: ")
    assert fragment in err
    assert not data.exists()  # bad input changes nothing, not even a new secret


def test_issue_missing_required_flag_is_a_usage_error(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as excinfo:
        main(issue(data, "--agent", "a", "--rights", "read"))
    assert excinfo.value.code == 2
    assert "--workspace" in capsys.readouterr().err


def test_env_secret_wins(
    data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGORA_SECRET", "k" * 40)
    code, out, _ = run(capsys, issue(data, "--agent", "a", "--workspace", "w", "--rights", "read"))
    assert code == 0
    assert not data.exists()
    assert TokenSigner(b"k" * 40).verify(out.strip()).agent == "a"


def test_short_env_secret(
    data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGORA_SECRET", "short")
    code, out, err = run(
        capsys, issue(data, "--agent", "a", "--workspace", "w", "--rights", "read")
    )
    assert code == 2 and out == ""
    assert "AGORA_SECRET" in err and "32" in err


def test_data_dir_from_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "agora.toml"
    config.write_text(f'[storage]\ndata = "{tmp_path / "from-config"}"\n')
    base = ["token", "issue", "--agent", "a", "--workspace", "w", "--rights", "read"]
    code, _, err = run(capsys, [*base, "--config", str(config)])
    assert code == 0, err
    assert (tmp_path / "from-config" / "secret").exists()
    code, _, _ = run(capsys, [*base, "--config", str(config), "--data", str(tmp_path / "flag")])
    assert code == 0
    assert (tmp_path / "flag" / "secret").exists()  # the flag wins over the file


def test_bad_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "agora.toml"
    config.write_text("[storage]\ndatta = 'x'\n")
    code, out, err = run(
        capsys,
        ["token", "issue", "--agent", "a", "--workspace", "w", "--rights", "read",
         "--config", str(config)],
    )  # fmt: skip
    assert code == 2 and out == ""
    assert "datta" in err and str(config) in err


def test_issue_follows_auth_max_token_ttl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "agora.toml"
    config.write_text("[auth]\nmax_token_ttl = 600\n")
    base = ["token", "issue", "--data", str(tmp_path / "d"), "--config", str(config)]
    base += ["--agent", "a", "--workspace", "w", "--rights", "read"]
    code, out, err = run(capsys, [*base, "--ttl", "11m"])
    assert code == 2 and out == ""
    assert "longer than the maximum of 600 seconds" in err
    code, out, err = run(capsys, [*base, "--ttl", "10m"])
    assert code == 0, err
    # 60 days is allowed only where the operator raised the maximum.
    config.write_text(f"[auth]\nmax_token_ttl = {60 * 86400}\n")
    code, out, err = run(capsys, [*base, "--ttl", "60d"])
    assert code == 0, err
    cap = TokenSigner(load_secret(tmp_path / "d", {}), max_ttl=60 * 86400).verify(out.strip())
    assert cap.lifetime == 60 * 86400
    with pytest.raises(Unauthorized) as excinfo:  # a default hub refuses it at use
        TokenSigner(load_secret(tmp_path / "d", {})).verify(out.strip())
    assert excinfo.value.details["reason"] == "lifetime"


# -- inspect -----------------------------------------------------------------------------------


def test_inspect(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, token, _ = run(capsys, issue(data, "--agent", "bob", "--workspace", "w", "--rights", "read"))
    code, out, err = run(capsys, ["token", "inspect", token.strip(), "--data", str(data)])
    assert code == 0, err
    claims = json.loads(out)
    assert claims["agent"] == "bob"
    assert claims["workspaces"] == ["w"]
    assert claims["rights"] == ["read"]


def test_inspect_other_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--agent", "bob", "--workspace", "w", "--rights", "read"]
    _, token, _ = run(capsys, issue(tmp_path / "one", *argv))
    run(capsys, issue(tmp_path / "two", *argv))
    code, out, err = run(
        capsys, ["token", "inspect", token.strip(), "--data", str(tmp_path / "two")]
    )
    assert code == 1 and out == ""
    assert err == "agora token inspect: error: invalid_signature: token signature is invalid\n"


def test_inspect_garbage(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, issue(data, "--agent", "bob", "--workspace", "w", "--rights", "read"))
    code, out, err = run(capsys, ["token", "inspect", "not-a-token", "--data", str(data)])
    assert code == 1 and out == ""
    assert err.startswith("agora token inspect: error: malformed: ") and err.count("\n") == 1


def test_inspect_without_a_secret_creates_nothing(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, ["token", "inspect", "x.y.z", "--data", str(data)])
    assert code == 2 and out == ""
    assert "does not exist" in err
    assert not data.exists()


# -- revoke / revoked --------------------------------------------------------------------------


def revoke(data: Path, *extra: str) -> list[str]:
    return ["token", "revoke", "--data", str(data), *extra]


def test_revoke_and_list(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, token, _ = run(capsys, issue(data, "--agent", "bob", "--workspace", "w", "--rights", "read"))
    jti = TokenSigner(load_secret(data, {})).verify(token.strip()).token_id
    code, out, err = run(capsys, revoke(data, "--token-id", jti, "--reason", "leaked in CI"))
    assert code == 0, err
    assert out.split()[0] == "1"
    before = int(time.time())
    code, out, err = run(capsys, revoke(data, "--agent", "mallory", "--json"))
    assert code == 0, err
    event = json.loads(out)
    assert event["kind"] == "tokenRevoked" and event["workspace"] == SYSTEM_WORKSPACE
    assert event["payload"]["agent"] == "mallory"
    assert before <= event["payload"]["before"] <= int(time.time())
    assert event["producer"] == "cli"

    code, out, err = run(capsys, ["token", "revoked", "--data", str(data)])
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("1 ") and f"tokenId={jti}" in lines[0]
    assert 'reason="leaked in CI"' in lines[0]
    assert lines[1].startswith("2 ") and "agent=mallory" in lines[1] and "before=" in lines[1]
    code, out, _ = run(capsys, ["token", "revoked", "--data", str(data), "--json"])
    assert code == 0
    assert [json.loads(line)["payload"].get("tokenId") for line in out.splitlines()] == [
        jti,
        None,
    ]


def test_revoke_an_id_that_starts_with_a_dash(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Tokens issued before ids avoided a leading "-" still exist; "--token-id=ID" names them.
    code, out, err = run(capsys, revoke(data, "--token-id=-c1e3i9FH1aSEuPwsAmFKg"))
    assert code == 0, err
    code, out, err = run(capsys, ["token", "revoked", "--data", str(data)])
    assert "tokenId=-c1e3i9FH1aSEuPwsAmFKg" in out


def test_revoked_is_empty_at_first(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, issue(data, "--agent", "bob", "--workspace", "w", "--rights", "read"))
    code, out, err = run(capsys, ["token", "revoked", "--data", str(data)])
    assert (code, out, err) == (0, "", "")


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ([], "name a token id or an agent"),
        (["--token-id", ""], "tokenId must be 1-256 bytes"),
        (["--agent", "a\nb"], "agent must not contain control characters"),
        (["--agent", "a", "--reason", "x" * 300], "reason must be 1-256 bytes"),
    ],
)
def test_revoke_bad_input_writes_nothing(
    data: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragment: str
) -> None:
    code, out, err = run(capsys, revoke(data, *extra))
    assert code == 2 and out == ""
    assert fragment in err and err.startswith("agora token revoke: error: ")
    assert not data.exists()


def test_no_client_writes_the_system_workspace(
    data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agora append`` (an untrusted writer, like every client) cannot forge a revocation or
    write anything else into ``_agora``."""
    for line in (
        '{"kind":"tokenRevoked","payload":{"agent":"x"}}',
        '{"kind":"messagePosted","payload":{"text":"hi"}}',
    ):
        monkeypatch.setattr("sys.stdin", io.StringIO(line + "\n"))
        code, out, err = run(capsys, ["append", SYSTEM_WORKSPACE, "--data", str(data)])
        assert code == 1 and out == "", err
        assert "forbidden" in err
    code, out, _ = run(capsys, ["token", "revoked", "--data", str(data)])
    assert (code, out) == (0, "")


# -- helpers -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3600", 3600), ("90s", 90), ("30m", 1800), ("1h", 3600), ("7d", 604800), ("2w", 1209600)],
)
def test_parse_ttl(text: str, seconds: int) -> None:
    assert parse_ttl(text) == seconds


def test_parse_ttl_maximum() -> None:
    assert parse_ttl("10m", 600) == 600
    with pytest.raises(BadRequest) as excinfo:
        parse_ttl("601", 600)
    assert excinfo.value.details == {"field": "ttl", "limit": 600}


@pytest.mark.parametrize("text", ["", "0", "0h", "1.5h", "h", "1y", "-1", "1 h", "1hh", "9" * 10])
def test_parse_ttl_rejects(text: str) -> None:
    with pytest.raises(BadRequest) as excinfo:
        parse_ttl(text)
    assert excinfo.value.details["field"] == "ttl"


def test_split_list() -> None:
    assert split_list(" a, b,,c ,") == ["a", "b", "c"]
    assert split_list("") == []
