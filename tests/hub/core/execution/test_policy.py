"""Policies, narrowing, capabilities and the ordered fail-closed validators. Pure: no backend
runs here (hub/core/execution/policy.py, validate.py, errors.py)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.base import (
    BackendCapabilities,
    EnvironmentPolicy,
    ExecutionIsolation,
    ExecutionLanguage,
    ExecutionRequest,
    FilesystemPolicy,
    GuestModule,
    InvalidRequest,
    ModuleBlob,
    PolicyPatch,
    Rejected,
    SandboxPolicy,
    Source,
    UnsupportedLanguage,
    UnsupportedPolicy,
    host_local,
    narrow,
    strict,
    strict_js,
    strict_python,
    validate_policy,
    validate_request,
)
from hub.core.errors import BadRequest, Forbidden, Unavailable
from hub.core.execution.errors import EXEC_CODES, BackendUnavailable, ExecutionError
from hub.core.execution.policy import fs_within

MIB = 1024 * 1024
COMMAND = ExecutionLanguage.COMMAND
WASM = ExecutionLanguage.WASM

ENFORCES_ALL = BackendCapabilities(
    isolation=ExecutionIsolation.CONTAINER_EPHEMERAL,
    enforces_network=True,
    enforces_filesystem=True,
    enforces_environment=True,
    enforces_timeout=True,
    enforces_memory=True,
    enforces_pids=True,
    enforces_cpu=True,
    languages=frozenset({COMMAND, WASM}),
)
ENFORCES_NOTHING = BackendCapabilities(
    isolation=ExecutionIsolation.HOST_LOCAL, languages=frozenset({COMMAND})
)


def control(excinfo: pytest.ExceptionInfo[UnsupportedPolicy]) -> str:
    value: str = excinfo.value.details["control"]
    return value


# -- presets --------------------------------------------------------------------------------


def test_presets() -> None:
    p = strict()
    assert p.network == "disabled" and p.filesystem.mode == "none"
    assert p.environment.mode == "none"
    assert (p.timeout_ms, p.max_stdout_bytes, p.max_stderr_bytes) == (30_000, MIB, MIB)
    assert host_local().network == "enabled" and host_local().filesystem.mode == "host"
    assert strict_js().timeout_ms == 5_000 and strict_js().network == "disabled"
    assert strict_python().timeout_ms == 10_000 and strict_python().filesystem.mode == "none"


def test_policy_json_is_camel_case_and_round_trips() -> None:
    policy = strict().replace(
        filesystem=FilesystemPolicy.paths(read_only=["docs"], read_write=["out"]),
        environment=EnvironmentPolicy.allow_list(["B", "A"]),
        memory_bytes=64 * MIB,
    )
    data = msgspec.json.encode(policy)
    assert b'"timeoutMs":30000' in data and b'"readWrite":["out"]' in data
    assert msgspec.json.decode(data, type=SandboxPolicy) == policy
    assert policy.environment.allow == ("A", "B")


@pytest.mark.parametrize(
    "raw",
    [
        b'{"filesystem": {"mode": "workspaceReadWrite", "root": "../up"}}',
        b'{"filesystem": {"mode": "workspaceReadWrite", "root": "/etc"}}',
        b'{"filesystem": {"mode": "none", "readOnly": ["a"]}}',
        b'{"filesystem": {"mode": "everything"}}',
        b'{"network": "sometimes"}',
        b'{"timeoutMs": 0}',
        b'{"maxStdoutBytes": -1}',
        b'{"memoryBytes": 1}',
        b'{"environment": {"mode": "allowList", "allow": ["A=B"]}}',
        b'{"workingDirectory": "../x"}',
    ],
)
def test_invalid_policies_cannot_be_built(raw: bytes) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(raw, type=SandboxPolicy)


def test_invalid_policy_in_python_raises_invalid_request() -> None:
    with pytest.raises(InvalidRequest) as excinfo:
        FilesystemPolicy.workspace_read_only("a/../../b")
    assert excinfo.value.details["field"] == "filesystem.root"
    assert FilesystemPolicy.workspace_read_only("./a//b/").root == "a/b"


def test_unknown_patch_fields_are_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"netwrok": "enabled"}', type=PolicyPatch)


# -- narrowing -------------------------------------------------------------------------------

BASE = strict().replace(
    filesystem=FilesystemPolicy.workspace_read_write(),
    environment=EnvironmentPolicy.allow_list(["A", "B"]),
    memory_bytes=512 * MIB,
    pids=256,
    cpus=1.0,
)


def test_narrow_without_request_is_the_base() -> None:
    assert narrow(BASE, None) == BASE
    assert narrow(BASE, PolicyPatch()) == BASE
    assert narrow(BASE, BASE) == BASE


def test_narrow_accepts_narrower_values() -> None:
    got = narrow(
        BASE,
        PolicyPatch(
            filesystem=FilesystemPolicy.workspace_read_only("src"),
            environment=EnvironmentPolicy.allow_list(["A"]),
            timeout_ms=1000,
            max_stdout_bytes=10,
            memory_bytes=64 * MIB,
            pids=10,
            cpus=0.5,
            working_directory="src",
        ),
    )
    assert got.filesystem == FilesystemPolicy.workspace_read_only("src")
    assert got.environment.allow == ("A",)
    assert (got.timeout_ms, got.max_stdout_bytes, got.max_stderr_bytes) == (1000, 10, MIB)
    assert (got.memory_bytes, got.pids, got.cpus) == (64 * MIB, 10, 0.5)
    assert got.network == "disabled" and got.working_directory == "src"


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        (PolicyPatch(network="enabled"), "network"),
        (PolicyPatch(filesystem=FilesystemPolicy.host()), "filesystem"),
        (PolicyPatch(environment=EnvironmentPolicy.allow_list(["C"])), "environment"),
        (PolicyPatch(timeout_ms=30_001), "timeoutMs"),
        (PolicyPatch(max_stderr_bytes=MIB + 1), "maxStderrBytes"),
        (PolicyPatch(memory_bytes=1024 * MIB), "memoryBytes"),
        (PolicyPatch(pids=257), "pids"),
        (PolicyPatch(cpus=2.0), "cpus"),
    ],
)
def test_narrow_refuses_anything_wider(patch: PolicyPatch, field: str) -> None:
    with pytest.raises(Rejected) as excinfo:
        narrow(BASE, patch)
    assert excinfo.value.details["field"] == field
    assert excinfo.value.code == "forbidden" and excinfo.value.exec_code == "rejected"


def test_network_on_only_where_the_instance_allows_it() -> None:
    assert narrow(host_local(), PolicyPatch(network="enabled")).network == "enabled"
    assert narrow(host_local(), PolicyPatch(network="disabled")).network == "disabled"


def test_unset_base_limits_accept_any_value() -> None:
    assert narrow(strict(), PolicyPatch(memory_bytes=64 * MIB)).memory_bytes == 64 * MIB


@pytest.mark.parametrize(
    ("requested", "base", "within"),
    [
        (FilesystemPolicy.none(), FilesystemPolicy.none(), True),
        (FilesystemPolicy.workspace_read_only(), FilesystemPolicy.none(), False),
        (FilesystemPolicy.workspace_read_only(), FilesystemPolicy.workspace_read_write(), True),
        (FilesystemPolicy.workspace_read_write(), FilesystemPolicy.workspace_read_only(), False),
        (
            FilesystemPolicy.workspace_read_write("a/b"),
            FilesystemPolicy.workspace_read_write("a"),
            True,
        ),
        (
            FilesystemPolicy.workspace_read_write("a"),
            FilesystemPolicy.workspace_read_write("a/b"),
            False,
        ),
        (
            FilesystemPolicy.workspace_read_only("ab"),
            FilesystemPolicy.workspace_read_only("a"),
            False,
        ),
        (FilesystemPolicy.paths(["a"], ["b/c"]), FilesystemPolicy.paths([], ["a", "b"]), True),
        (FilesystemPolicy.paths([], ["a"]), FilesystemPolicy.paths(["a"], []), False),
        (FilesystemPolicy.paths(["x"]), FilesystemPolicy.workspace_read_only(), True),
        (FilesystemPolicy.workspace_read_only("a"), FilesystemPolicy.paths(["a"]), True),
        (FilesystemPolicy.workspace_read_only(), FilesystemPolicy.paths(["a"]), False),
        (FilesystemPolicy.host(), FilesystemPolicy.workspace_read_write(), False),
        (FilesystemPolicy.workspace_read_write(), FilesystemPolicy.host(), True),
    ],
)
def test_filesystem_order(
    requested: FilesystemPolicy, base: FilesystemPolicy, within: bool
) -> None:
    assert fs_within(requested, base) is within


paths = st.lists(st.sampled_from(["a", "b", "a/b", "a/c", "b/c/d", "."]), max_size=3)
filesystems = st.one_of(
    st.just(FilesystemPolicy.none()),
    st.just(FilesystemPolicy.host()),
    st.sampled_from(["a", "a/b", ".", "b"]).map(FilesystemPolicy.workspace_read_only),
    st.sampled_from(["a", "a/b", ".", "b"]).map(FilesystemPolicy.workspace_read_write),
    st.builds(FilesystemPolicy.paths, paths, paths),
)
policies = st.builds(
    SandboxPolicy,
    network=st.sampled_from(["disabled", "enabled"]),
    filesystem=filesystems,
    environment=st.one_of(
        st.just(EnvironmentPolicy.none()),
        st.lists(st.sampled_from(["A", "B", "C"]), max_size=3).map(EnvironmentPolicy.allow_list),
    ),
    timeout_ms=st.integers(1, 60_000),
    max_stdout_bytes=st.integers(0, 4 * MIB),
    max_stderr_bytes=st.integers(0, 4 * MIB),
    memory_bytes=st.one_of(st.none(), st.integers(4 * MIB, 1024 * MIB)),
    pids=st.one_of(st.none(), st.integers(1, 1000)),
    cpus=st.one_of(st.none(), st.floats(0.01, 8)),
)


def is_within(p: SandboxPolicy, base: SandboxPolicy) -> bool:
    def limit_ok(value: float | None, limit: float | None) -> bool:
        return limit is None or (value is not None and value <= limit)

    return (
        (p.network == "disabled" or base.network == "enabled")
        and fs_within(p.filesystem, base.filesystem)
        and (
            p.environment.mode == "none"
            or (
                base.environment.mode == "allowList"
                and set(p.environment.allow) <= set(base.environment.allow)
            )
        )
        and p.timeout_ms <= base.timeout_ms
        and p.max_stdout_bytes <= base.max_stdout_bytes
        and p.max_stderr_bytes <= base.max_stderr_bytes
        and limit_ok(p.memory_bytes, base.memory_bytes)
        and limit_ok(p.pids, base.pids)
        and limit_ok(p.cpus, base.cpus)
    )


@given(policies, policies)
def test_narrow_never_widens(base: SandboxPolicy, requested: SandboxPolicy) -> None:
    # An unset limit in the request means "no opinion": the instance's limit applies.
    effective = requested.replace(
        memory_bytes=base.memory_bytes
        if requested.memory_bytes is None
        else requested.memory_bytes,
        pids=base.pids if requested.pids is None else requested.pids,
        cpus=base.cpus if requested.cpus is None else requested.cpus,
    )
    try:
        got = narrow(base, requested)
    except Rejected:
        assert not is_within(effective, base)
        return
    assert got == effective
    assert is_within(got, base)


@given(policies)
def test_narrow_is_reflexive_and_fs_order_is_reflexive(policy: SandboxPolicy) -> None:
    assert narrow(policy, policy) == policy
    assert fs_within(policy.filesystem, policy.filesystem)
    assert fs_within(FilesystemPolicy.none(), policy.filesystem)


# -- validate_policy: adk-code's order, first failure wins ------------------------------------

EVERYTHING_RESTRICTED = strict().replace(memory_bytes=64 * MIB, pids=10, cpus=1.0)


@pytest.mark.parametrize(
    ("missing", "expected"),
    [
        # Remove enforcement flags one at a time, in reverse order: the first failing check in
        # adk-code's order is the one reported.
        ({}, None),
        ({"enforces_cpu"}, "cpu"),
        ({"enforces_cpu", "enforces_pids"}, "pids"),
        ({"enforces_cpu", "enforces_pids", "enforces_memory"}, "memory"),
        ({"enforces_memory", "enforces_timeout"}, "timeout"),
        ({"enforces_timeout", "enforces_environment"}, "environment"),
        ({"enforces_environment", "enforces_filesystem", "enforces_timeout"}, "filesystem"),
        ({"enforces_network", "enforces_filesystem", "enforces_environment"}, "network"),
    ],
)
def test_validate_policy_order(missing: set[str], expected: str | None) -> None:
    caps = ENFORCES_ALL.replace(**dict.fromkeys(missing, False))
    if expected is None:
        validate_policy(EVERYTHING_RESTRICTED, caps)
        return
    with pytest.raises(UnsupportedPolicy) as excinfo:
        validate_policy(EVERYTHING_RESTRICTED, caps)
    assert control(excinfo) == expected


def test_network_check_only_when_disabled() -> None:
    caps = ENFORCES_ALL.replace(enforces_network=False)
    validate_policy(strict().replace(network="enabled"), caps)
    with pytest.raises(UnsupportedPolicy):
        validate_policy(strict(), caps)


def test_host_filesystem_needs_no_filesystem_enforcement() -> None:
    caps = ENFORCES_ALL.replace(enforces_filesystem=False)
    validate_policy(host_local().replace(network="disabled"), caps)
    for fs in (
        FilesystemPolicy.none(),
        FilesystemPolicy.workspace_read_only(),
        FilesystemPolicy.workspace_read_write(),
        FilesystemPolicy.paths(["a"]),
    ):
        with pytest.raises(UnsupportedPolicy) as excinfo:
            validate_policy(strict().replace(filesystem=fs), caps)
        assert control(excinfo) == "filesystem"


def test_timeout_is_always_required() -> None:
    caps = ENFORCES_ALL.replace(enforces_timeout=False)
    with pytest.raises(UnsupportedPolicy) as excinfo:
        validate_policy(host_local(), caps)
    assert control(excinfo) == "timeout"


def test_filesystem_mode_the_backend_cannot_offer() -> None:
    caps = ENFORCES_ALL.replace(filesystem_modes=frozenset({"none"}))
    with pytest.raises(UnsupportedPolicy) as excinfo:
        validate_policy(host_local(), caps)
    assert control(excinfo) == "filesystem"


def test_nothing_enforced_refuses_even_the_loosest_policy() -> None:
    with pytest.raises(UnsupportedPolicy) as excinfo:
        validate_policy(host_local(), ENFORCES_NOTHING)
    assert control(excinfo) == "environment"


# -- validate_request -----------------------------------------------------------------------


def request(**kw: object) -> ExecutionRequest:
    kw.setdefault("exec_id", "e1")
    kw.setdefault("payload", Source("true"))
    return ExecutionRequest(**kw)  # type: ignore[arg-type]


def test_language_is_checked_before_payload_and_policy() -> None:
    caps = ENFORCES_NOTHING  # also cannot enforce the strict policy
    with pytest.raises(UnsupportedLanguage) as excinfo:
        validate_request(request(language=ExecutionLanguage.RUST), caps)
    assert excinfo.value.details["supported"] == ["command"]


def test_payload_is_checked_before_policy() -> None:
    caps = ENFORCES_NOTHING.replace(languages=frozenset({COMMAND, WASM}))
    with pytest.raises(InvalidRequest) as excinfo:
        validate_request(request(payload=GuestModule(b"\0asm\1\0\0\0")), caps)
    assert excinfo.value.details["field"] == "module"
    with pytest.raises(InvalidRequest) as excinfo:
        validate_request(request(payload=ModuleBlob("ab" * 32)), caps)
    assert excinfo.value.details["field"] == "module"
    with pytest.raises(InvalidRequest) as excinfo:
        validate_request(request(language=WASM, payload=Source("(module)")), caps)
    assert excinfo.value.details["field"] == "source"
    # The payload is fine: now the policy is what fails.
    with pytest.raises(UnsupportedPolicy):
        validate_request(request(language=WASM, payload=GuestModule(b"\0asm\1\0\0\0")), caps)


def test_policy_is_checked_before_request_fields() -> None:
    caps = ENFORCES_ALL.replace(enforces_network=False)
    with pytest.raises(UnsupportedPolicy):
        validate_request(request(exec_id="", env={"X": "1"}), caps)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"exec_id": ""}, "execId"),
        ({"exec_id": "x" * 257}, "execId"),
        ({"exec_id": "a\nb"}, "execId"),
        ({"input": {"a": 1}}, "input"),
        ({"argv": ("a\0b",)}, "argv"),
        ({"payload": Source("a\0b")}, "source"),
        ({"cwd": "../x"}, "cwd"),
        ({"cwd": "/etc"}, "cwd"),
        ({"timeout_ms": 0}, "timeoutMs"),
        ({"env": {"A=B": "x"}}, "env"),
    ],
)
def test_invalid_request_fields(changes: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as excinfo:
        validate_request(request(**changes), ENFORCES_ALL)
    assert excinfo.value.details["field"] == field
    assert excinfo.value.code == "badRequest"


def test_request_may_not_exceed_its_policy() -> None:
    with pytest.raises(Rejected) as excinfo:
        validate_request(request(timeout_ms=30_001), ENFORCES_ALL)
    assert excinfo.value.details["field"] == "timeoutMs"
    with pytest.raises(Rejected):
        validate_request(request(max_stdout=MIB + 1), ENFORCES_ALL)
    with pytest.raises(Rejected) as excinfo:
        validate_request(request(env={"HOME": "/"}), ENFORCES_ALL)
    assert excinfo.value.details["name"] == "HOME"
    allowed = strict().replace(environment=EnvironmentPolicy.allow_list(["HOME"]))
    validate_request(request(env={"HOME": "/"}, policy=allowed, timeout_ms=5), ENFORCES_ALL)


def test_input_is_for_callable_languages() -> None:
    caps = ENFORCES_ALL.replace(languages=frozenset({ExecutionLanguage.PYTHON}))
    validate_request(request(language=ExecutionLanguage.PYTHON, input=None), caps)


def test_request_repr_hides_environment_values() -> None:
    text = repr(request(env={"TOKEN": "very-secret"}))
    assert "very-secret" not in text and "TOKEN" in text


# -- errors ----------------------------------------------------------------------------------


def test_every_exec_code_has_a_class_and_a_wire_code() -> None:
    assert set(EXEC_CODES) == {
        "unsupportedPolicy",
        "unsupportedLanguage",
        "compileFailed",
        "timeout",
        "executionFailed",
        "rejected",
        "invalidRequest",
        "internal",
        "dependencyNotFound",
        "sandbox",
        "invalidCode",
        "unavailable",
    }
    for code, cls in EXEC_CODES.items():
        error = cls("boom")
        assert isinstance(error, ExecutionError) and error.exec_code == code
        assert error.details["execCode"] == code
        assert error.code in {"badRequest", "forbidden", "unavailable", "internal"}
    assert isinstance(BackendUnavailable("x"), Unavailable)
    assert isinstance(Rejected("x"), Forbidden)
    assert isinstance(InvalidRequest("x"), BadRequest) and isinstance(
        InvalidRequest("x"), ValueError
    )
