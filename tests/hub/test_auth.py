"""Tests for hub.auth: capability tokens, rights checks and the hub secret."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import jwt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub import auth
from hub.auth import TokenSigner, load_or_create_secret, load_secret
from hub.config import ConfigError
from hub.core.capability import RIGHTS, SYSTEM_WORKSPACE, Capability, RevocationList
from hub.core.errors import BadRequest, Forbidden, Unauthorized
from hub.core.events import TokenRevokedPayload
from hub.core.validation import UNSAFE_CHARS_RE

SECRET = b"0123456789abcdef0123456789abcdef"
OTHER_SECRET = b"fedcba9876543210fedcba9876543210"
NOW = 1_700_000_000


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def signer(clock: Clock) -> TokenSigner:
    return TokenSigner(SECRET, clock=clock)


def reason(excinfo: pytest.ExceptionInfo[Unauthorized]) -> str:
    value: str = excinfo.value.details["reason"]
    return value


def good_claims(**changes: object) -> dict[str, object]:
    claims: dict[str, object] = {
        "sub": "alice",
        "iat": NOW,
        "exp": NOW + 60,
        "jti": "t1",
        "workspaces": ["w"],
        "rights": ["read"],
        "backends": [],
    }
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not None}


def sign(claims: dict[str, object], key: bytes = SECRET, algorithm: str = "HS256") -> str:
    return jwt.encode(claims, key, algorithm=algorithm)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# -- issue / verify -----------------------------------------------------------------------------


def test_round_trip(signer: TokenSigner) -> None:
    token = signer.issue(
        "alice", ["w1", "w2"], ["write", "read"], backends=["py"], ttl_seconds=3600
    )
    cap = signer.verify(token)
    assert cap.agent == "alice"
    assert cap.workspaces == ("w1", "w2")
    assert cap.rights == ("read", "write")  # canonical order
    assert cap.backends == ("py",)
    assert cap.issued_at == NOW
    assert cap.expires_at == NOW + 3600
    assert cap.token_id
    assert "." in token and "\n" not in token


def test_token_ids_differ(signer: TokenSigner) -> None:
    a = signer.verify(signer.issue("a", ["w"], ["read"], ttl_seconds=60))
    b = signer.verify(signer.issue("a", ["w"], ["read"], ttl_seconds=60))
    assert a.token_id != b.token_id


def test_token_ids_never_look_like_an_option(signer: TokenSigner) -> None:
    # One random id in 64 began with "-", and `agora token revoke --token-id ID` then failed
    # with "expected one argument" (CI saw it). 1,000 ids: without the rule, P(pass) ≈ 1e-7.
    ids = [
        signer.verify(signer.issue("a", ["w"], ["read"], ttl_seconds=60)).token_id
        for _ in range(1000)
    ]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == 1000


def test_lists_are_normalized(signer: TokenSigner) -> None:
    cap = signer.verify(
        signer.issue(
            "a", ["w", "w", "v"], ["admin", "read", "read"], backends=["b", "*"], ttl_seconds=60
        )
    )
    assert cap.workspaces == ("w", "v")
    assert cap.rights == ("read", "admin")
    assert cap.backends == ("*",)
    assert signer.verify(signer.issue("a", ["w", "*"], ["read"], ttl_seconds=60)).workspaces == (
        "*",
    )


def test_capability_json_is_camel_case(signer: TokenSigner) -> None:
    import msgspec

    cap = signer.verify(signer.issue("a", ["w"], ["read"], ttl_seconds=60))
    encoded = json.loads(msgspec.json.encode(cap))
    assert set(encoded) == {
        "agent",
        "workspaces",
        "rights",
        "backends",
        "expiresAt",
        "issuedAt",
        "tokenId",
    }


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"agent": ""}, "agent"),
        ({"agent": "x" * 257}, "agent"),
        ({"agent": "é" * 129}, "agent"),  # 258 bytes
        ({"agent": "a\nb"}, "agent"),
        ({"agent": 7}, "agent"),
        ({"workspaces": []}, "workspaces"),
        ({"workspaces": ["bad/name"]}, "workspaces"),
        ({"workspaces": [".."]}, "workspaces"),
        ({"workspaces": "w"}, "workspaces"),  # a string is not a list
        ({"rights": []}, "rights"),
        ({"rights": ["fly"]}, "rights"),
        ({"rights": "read"}, "rights"),
        ({"backends": ["no spaces"]}, "backends"),
        ({"ttl_seconds": 0}, "ttl"),
        ({"ttl_seconds": -5}, "ttl"),
        ({"ttl_seconds": True}, "ttl"),
        ({"ttl_seconds": 1.5}, "ttl"),
        ({"ttl_seconds": auth.DEFAULT_MAX_TOKEN_TTL + 1}, "ttl"),
    ],
)
def test_issue_rejects_bad_input(
    signer: TokenSigner, kwargs: dict[str, object], field: str
) -> None:
    args: dict[str, object] = {
        "agent": "a",
        "workspaces": ["w"],
        "rights": ["read"],
        "backends": (),
        "ttl_seconds": 60,
    }
    args.update(kwargs)
    with pytest.raises(BadRequest) as excinfo:
        signer.issue(**args)  # type: ignore[arg-type]
    assert excinfo.value.details["field"] == field
    assert excinfo.value.code == "badRequest"


def test_longest_ttl(signer: TokenSigner) -> None:
    assert signer.max_ttl == auth.DEFAULT_MAX_TOKEN_TTL == 30 * 86400
    ttl = auth.DEFAULT_MAX_TOKEN_TTL
    cap = signer.verify(signer.issue("a", ["w"], ["read"], ttl_seconds=ttl))
    assert cap.expires_at == NOW + ttl


def test_max_ttl_is_configurable_up_to_366_days(clock: Clock) -> None:
    short = TokenSigner(SECRET, clock=clock, max_ttl=600)
    with pytest.raises(BadRequest) as excinfo:
        short.issue("a", ["w"], ["read"], ttl_seconds=601)
    assert excinfo.value.details == {"field": "ttl", "limit": 600}
    long = TokenSigner(SECRET, clock=clock, max_ttl=auth.MAX_TTL_SECONDS)
    token = long.issue("a", ["w"], ["read"], ttl_seconds=auth.MAX_TTL_SECONDS)
    assert long.verify(token).expires_at == NOW + auth.MAX_TTL_SECONDS
    for bad in (0, auth.MAX_TTL_SECONDS + 1):
        with pytest.raises(ConfigError, match="max_token_ttl"):
            TokenSigner(SECRET, max_ttl=bad)


def test_lifetime_over_the_maximum_refused_at_use(signer: TokenSigner, clock: Clock) -> None:
    """A correctly signed token whose exp - iat exceeds max_ttl (minted with a stolen secret,
    or by a hub configured more loosely) is refused, even while it has not expired."""
    at_limit = sign(good_claims(exp=NOW + auth.DEFAULT_MAX_TOKEN_TTL))
    assert signer.verify(at_limit).lifetime == auth.DEFAULT_MAX_TOKEN_TTL
    for exp in (NOW + auth.DEFAULT_MAX_TOKEN_TTL + 1, 2**70):
        with pytest.raises(Unauthorized) as excinfo:
            signer.verify(sign(good_claims(exp=exp)))
        assert reason(excinfo) in {"lifetime", "malformed"}
    with pytest.raises(Unauthorized) as excinfo:
        signer.verify(sign(good_claims(exp=NOW + auth.DEFAULT_MAX_TOKEN_TTL + 1)))
    assert reason(excinfo) == "lifetime"
    # A signer with a shorter maximum refuses what the default accepts.
    strict = TokenSigner(SECRET, clock=clock, max_ttl=30)
    with pytest.raises(Unauthorized) as excinfo:
        strict.verify(sign(good_claims()))  # 60 s
    assert reason(excinfo) == "lifetime"


def test_iat_in_the_future_refused_beyond_the_leeway(signer: TokenSigner) -> None:
    leeway = auth.IAT_LEEWAY_SECONDS
    assert leeway == 60
    ok = sign(good_claims(iat=NOW + leeway, exp=NOW + leeway + 60))
    assert signer.verify(ok).issued_at == NOW + leeway
    with pytest.raises(Unauthorized) as excinfo:
        signer.verify(sign(good_claims(iat=NOW + leeway + 1, exp=NOW + leeway + 61)))
    assert reason(excinfo) == "future"


def test_agent_at_the_byte_limit_is_fine(signer: TokenSigner) -> None:
    assert signer.verify(signer.issue("x" * 256, ["w"], ["read"], ttl_seconds=60)).agent == (
        "x" * 256
    )


def test_short_secret_refused() -> None:
    with pytest.raises(ConfigError, match="32"):
        TokenSigner(b"x" * 31)


# -- expiry ------------------------------------------------------------------------------------


def test_expired(signer: TokenSigner, clock: Clock) -> None:
    token = signer.issue("a", ["w"], ["read"], ttl_seconds=60)
    clock.now = NOW + 59.999
    assert signer.verify(token).expires_at == NOW + 60
    clock.now = NOW + 60  # exp is exclusive, no leeway
    with pytest.raises(Unauthorized) as excinfo:
        signer.verify(token)
    assert reason(excinfo) == "expired"
    assert excinfo.value.code == "unauthorized"


def test_capability_expired(signer: TokenSigner) -> None:
    cap = signer.verify(signer.issue("a", ["w"], ["read"], ttl_seconds=10))
    assert not cap.expired(NOW + 9)
    assert cap.expired(NOW + 10)


# -- forgery -----------------------------------------------------------------------------------


def test_wrong_secret(signer: TokenSigner) -> None:
    token = TokenSigner(OTHER_SECRET).issue("a", ["w"], ["admin"], ttl_seconds=60)
    with pytest.raises(Unauthorized) as excinfo:
        signer.verify(token)
    assert reason(excinfo) == "invalid_signature"


def test_tampered_payload(signer: TokenSigner) -> None:
    token = signer.issue("a", ["w"], ["read"], ttl_seconds=60)
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["rights"] = ["admin"]
    forged = ".".join([header, b64(json.dumps(claims).encode()), signature])
    with pytest.raises(Unauthorized) as excinfo:
        signer.verify(forged)
    assert reason(excinfo) == "invalid_signature"


def test_tampered_signature(signer: TokenSigner) -> None:
    token = signer.issue("a", ["w"], ["read"], ttl_seconds=60)
    header, payload, signature = token.split(".")
    flipped = b64(bytes(b ^ 1 for b in base64.urlsafe_b64decode(signature + "=")))
    with pytest.raises(Unauthorized) as excinfo:
        signer.verify(".".join([header, payload, flipped]))
    assert reason(excinfo) == "invalid_signature"


def test_alg_none_refused(signer: TokenSigner) -> None:
    header = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    payload = b64(json.dumps(good_claims(rights=["admin"])).encode())
    for token in (f"{header}.{payload}.", f"{header}.{payload}.{b64(b'x' * 32)}"):
        with pytest.raises(Unauthorized) as excinfo:
            signer.verify(token)
        assert reason(excinfo) == "invalid_signature"


def test_hs512_refused(signer: TokenSigner) -> None:
    # Signed with the right secret, but not with the pinned algorithm.
    token = sign(good_claims(), key=SECRET * 2, algorithm="HS512")
    with pytest.raises(Unauthorized) as excinfo:
        TokenSigner(SECRET * 2, clock=Clock()).verify(token)
    assert reason(excinfo) == "invalid_signature"


def test_hs256_signed_outside_issue_verifies(signer: TokenSigner) -> None:
    # The format is plain JWT: a token built by another HS256 implementation is accepted.
    cap = signer.verify(sign(good_claims(rights=["write", "read"], backends=["*"])))
    assert cap == Capability(
        agent="alice",
        workspaces=("w",),
        rights=("read", "write"),
        backends=("*",),
        expires_at=NOW + 60,
        issued_at=NOW,
        token_id="t1",
    )


# -- malformed ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    ["", "abc", "a.b.c", "a.b", "....", "x" * 9000, "eyJhbGciOiJIUzI1NiJ9.bm90IGpzb24.c2ln"],
)
def test_malformed_strings(signer: TokenSigner, token: str) -> None:
    with pytest.raises(Unauthorized) as excinfo:
        signer.verify(token)
    assert reason(excinfo) in {"malformed", "invalid_signature"}
    if "." not in token or len(token) > 8192:
        assert reason(excinfo) == "malformed"


def test_non_string_token(signer: TokenSigner) -> None:
    with pytest.raises(Unauthorized) as excinfo:
        signer.verify(None)  # type: ignore[arg-type]
    assert reason(excinfo) == "malformed"


@pytest.mark.parametrize(
    "changes",
    [
        {"exp": None},
        {"iat": None},
        {"sub": None},
        {"jti": None},
        {"workspaces": None},
        {"rights": None},
        {"backends": None},
        {"exp": "soon"},
        {"exp": float(NOW + 60)},
        {"iat": True},
        {"sub": 42},
        {"sub": ""},
        {"sub": "x" * 257},
        {"jti": ""},
        {"workspaces": []},
        {"workspaces": "w"},
        {"workspaces": ["bad name"]},
        {"rights": ["root"]},
        {"rights": []},
        {"rights": "admin"},
        {"backends": [1]},
        {"backends": ["a b"]},
        {"nbf": NOW + 1000},  # an unknown claim is refused, not ignored
        {"admin": True},
    ],
)
def test_bad_claims_signed_with_the_secret(signer: TokenSigner, changes: dict[str, object]) -> None:
    with pytest.raises(Unauthorized) as excinfo:
        signer.verify(sign(good_claims(**changes)))
    assert reason(excinfo) == "malformed"


# -- rights ------------------------------------------------------------------------------------


def cap(**changes: object) -> Capability:
    fields: dict[str, object] = {
        "agent": "a",
        "workspaces": ("w",),
        "rights": ("read",),
        "backends": (),
        "expires_at": NOW + 60,
        "issued_at": NOW,
        "token_id": "t",
    }
    fields.update(changes)
    return Capability(**fields)  # type: ignore[arg-type]


def test_rights_in_listed_workspace() -> None:
    c = cap(rights=("read", "exec"))
    assert c.has("read", "w") and c.has("exec", "w")
    assert not c.has("write", "w") and not c.has("admin", "w")
    assert not c.has("read", "other")
    c.require("read", "w")
    with pytest.raises(Forbidden) as excinfo:
        c.require("write", "w")
    assert excinfo.value.details == {"right": "write", "workspace": "w"}
    assert "write" in excinfo.value.message and "'w'" in excinfo.value.message
    with pytest.raises(Forbidden) as excinfo:
        c.require("read", "other")
    assert excinfo.value.details == {"right": "read", "workspace": "other"}
    assert "no access" in excinfo.value.message


def test_wildcard_workspace() -> None:
    c = cap(workspaces=("*",))
    assert c.allows_workspace("anything")
    assert c.has("read", "anything")


def test_admin_implies_every_right_but_only_in_its_workspaces() -> None:
    c = cap(rights=("admin",))
    for right in RIGHTS:
        assert c.has(right, "w")
        c.require(right, "w")
    assert not c.has("read", "elsewhere")


def test_admin_does_not_imply_backends() -> None:
    c = cap(rights=("admin",))
    assert not c.allows_backend("py")
    with pytest.raises(Forbidden) as excinfo:
        c.require_backend("py")
    assert excinfo.value.details == {"backend": "py"}


def test_backends(signer: TokenSigner) -> None:
    default = signer.verify(signer.issue("a", ["w"], ["exec"], ttl_seconds=60))
    assert default.backends == ()  # safe default: no backends unless named
    assert not default.allows_backend("process")
    some = cap(backends=("py", "wasm"))
    assert some.allows_backend("py") and not some.allows_backend("container")
    some.require_backend("wasm")
    assert cap(backends=("*",)).allows_backend("anything")


# -- property: random claims round-trip ---------------------------------------------------------

agents = st.text(
    st.characters(min_codepoint=0x20, exclude_categories=["Cs"]).filter(
        lambda c: not UNSAFE_CHARS_RE.match(c)  # ids refuse DEL, C1 and bidi controls too
    ),
    min_size=1,
    max_size=64,
)
names = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True).filter(
    lambda n: n not in {".", ".."}
)


@given(
    agent=agents,
    workspaces=st.lists(names, min_size=1, max_size=5) | st.just(["*"]),
    rights=st.sets(st.sampled_from(RIGHTS), min_size=1),
    backends=st.lists(names, max_size=4) | st.just(["*"]),
    ttl=st.integers(min_value=1, max_value=auth.DEFAULT_MAX_TOKEN_TTL),
)
def test_random_claims_round_trip(
    agent: str, workspaces: list[str], rights: set[str], backends: list[str], ttl: int
) -> None:
    signer = TokenSigner(SECRET, clock=Clock())
    c = signer.verify(signer.issue(agent, workspaces, rights, backends=backends, ttl_seconds=ttl))
    assert c.agent == agent
    assert c.workspaces == tuple(dict.fromkeys(workspaces))
    assert set(c.rights) == rights
    assert c.backends == tuple(dict.fromkeys(backends))
    assert c.expires_at - c.issued_at == ttl
    for w in workspaces:
        for r in rights:
            assert c.has(r, w)  # type: ignore[arg-type]


# -- the secret --------------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secret_created_once_0600_and_reused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old_umask = os.umask(0)  # the file must be 0600 whatever the umask
    try:
        first = load_or_create_secret(data, {})
    finally:
        os.umask(old_umask)
    path = data / "secret"
    assert mode(path) == 0o600
    assert mode(data) == 0o700
    assert len(first) >= 32
    inode = path.stat().st_ino
    assert load_or_create_secret(data, {}) == first
    assert load_secret(data, {}) == first
    assert path.stat().st_ino == inode
    assert sorted(p.name for p in data.iterdir()) == ["secret"]  # no temporary left behind
    # The file's content is the secret, so it can be copied into AGORA_SECRET.
    assert load_secret(tmp_path / "elsewhere", {"AGORA_SECRET": path.read_text().strip()}) == first


def test_secret_differs_per_data_dir(tmp_path: Path) -> None:
    assert load_or_create_secret(tmp_path / "a", {}) != load_or_create_secret(tmp_path / "b", {})


def test_create_keeps_a_secret_that_won_the_race(tmp_path: Path) -> None:
    existing = b"e" * 40
    (tmp_path / "secret").write_bytes(existing)
    (tmp_path / "secret").chmod(0o600)
    auth._create_secret(tmp_path)  # loses the link race: keeps the existing file
    assert load_secret(tmp_path, {}) == existing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]


def test_env_secret_wins(tmp_path: Path) -> None:
    env = {"AGORA_SECRET": "s" * 32}
    assert load_or_create_secret(tmp_path / "data", env) == b"s" * 32
    assert not (tmp_path / "data").exists()  # nothing created
    load_or_create_secret(tmp_path / "data", {})
    assert load_or_create_secret(tmp_path / "data", env) == b"s" * 32


@pytest.mark.parametrize("value", ["", "short", "x" * 31])
def test_short_env_secret_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match=r"AGORA_SECRET.*32"):
        load_or_create_secret(tmp_path, {"AGORA_SECRET": value})
    assert not (tmp_path / "secret").exists()


@pytest.mark.parametrize("bits", [0o640, 0o604, 0o620, 0o602])
def test_secret_accessible_by_others_refused(tmp_path: Path, bits: int) -> None:
    load_or_create_secret(tmp_path, {})
    (tmp_path / "secret").chmod(bits)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_or_create_secret(tmp_path, {})


def test_short_secret_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"tiny\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="32"):
        load_or_create_secret(tmp_path, {})
    assert path.read_bytes() == b"tiny\n"  # never overwritten


def test_secret_symlink_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"t" * 40)
    target.chmod(0o600)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "secret").symlink_to(target)
    with pytest.raises(ConfigError, match="symlink"):
        load_or_create_secret(tmp_path / "data", {})


def test_secret_directory_refused(tmp_path: Path) -> None:
    (tmp_path / "secret").mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="regular file"):
        load_secret(tmp_path, {})


def test_load_secret_does_not_create(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_secret(tmp_path / "data", {})
    assert not (tmp_path / "data").exists()


def test_signers_share_a_secret_through_the_data_dir(tmp_path: Path) -> None:
    token = TokenSigner(load_or_create_secret(tmp_path, {})).issue(
        "a", ["w"], ["read"], ttl_seconds=60
    )
    assert TokenSigner(load_secret(tmp_path, {})).verify(token).agent == "a"


# -- revocation list (pure) --------------------------------------------------------------------


def test_revocation_list_by_token_id_and_by_agent(signer: TokenSigner, clock: Clock) -> None:
    first = signer.verify(signer.issue("mallory", ["w"], ["read"], ttl_seconds=600))
    other = signer.verify(signer.issue("alice", ["w"], ["read"], ttl_seconds=600))
    revoked = RevocationList()
    assert not revoked.revokes(first) and len(revoked) == 0
    revoked.add(TokenRevokedPayload(token_id=first.token_id), at=NOW)
    assert revoked.revokes(first) and not revoked.revokes(other)

    clock.now = NOW + 10
    later = signer.verify(signer.issue("mallory", ["w"], ["read"], ttl_seconds=600))
    revoked.add(TokenRevokedPayload(agent="mallory", before=NOW + 9), at=NOW + 9)
    assert not revoked.revokes(later)  # issued after `before`
    revoked.add(TokenRevokedPayload(agent="mallory"), at=NOW + 10)  # before = the event's time
    assert revoked.revokes(later)  # iat == before: covered (whole seconds)
    revoked.add(TokenRevokedPayload(agent="mallory", before=NOW), at=NOW + 11)
    assert revoked.revokes(later)  # an older `before` never narrows a revocation
    assert not revoked.revokes(other)


def test_star_does_not_cover_the_system_workspace(signer: TokenSigner) -> None:
    star = signer.verify(signer.issue("ops", ["*"], ["admin"], ttl_seconds=60))
    assert star.has("read", "anything") and not star.has("read", SYSTEM_WORKSPACE)
    named = signer.verify(signer.issue("ops", [SYSTEM_WORKSPACE], ["read"], ttl_seconds=60))
    assert named.has("read", SYSTEM_WORKSPACE)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("BEARER abc", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert auth.bearer_token(header) == token
    headers = [] if header is None else [(b"authorization", header.encode())]
    assert auth.asgi_bearer_token({"headers": [(b"x-other", b"Bearer no"), *headers]}) == token


@given(st.from_regex(r"[A-Za-z0-9._-]{1,128}", fullmatch=True))
def test_a_relay_header_names_its_node_and_only_the_secret_makes_one(node: str) -> None:
    """``[cluster] owners``: the ``Agora-Relay`` value a node sends proves it is a node (an
    HMAC under the shared secret); a forged or altered one, or another secret's, names none."""
    signer = TokenSigner(b"k" * 32)
    header = signer.relay_header(node)
    assert signer.relay_node(header) == node
    assert TokenSigner(b"x" * 32).relay_node(header) is None
    name, _, proof = header.partition(" ")
    assert signer.relay_node(f"{name}x {proof}") is None
    assert signer.relay_node(f"{name} {proof[:-1]}0" if proof[-1] != "0" else f"{name} 1") is None
    for forged in ("", name, f"{name} ", f"{name} 00", " " + proof):
        assert signer.relay_node(forged) is None
