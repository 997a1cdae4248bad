"""Fail-closed checks run before any user code: :func:`validate_policy`, :func:`validate_request`.
Pure.

Both follow adk-code's order, and the first failure wins (so the error names the first problem,
deterministically):

``validate_policy(policy, caps)``
  1. network disabled but the backend cannot enforce it → :class:`UnsupportedPolicy`
  2. filesystem restricted (any mode but ``host``) but not enforceable → ``UnsupportedPolicy``
  3. environment restricted (always: ``none`` and ``allowList`` both restrict what the program
     sees) but not enforceable → ``UnsupportedPolicy``
  4. timeout not enforceable → always ``UnsupportedPolicy``

  Agora adds, after those: 5. a filesystem mode the backend cannot provide at all; 6-8. a
  memory, pids or cpu limit it cannot enforce → ``UnsupportedPolicy``.

``validate_request(request, caps)``
  1. language not supported → :class:`UnsupportedLanguage`
  2. a guest module (bytes or blob) with a non-Wasm language, or Wasm with source text →
     :class:`InvalidRequest`
  3. :func:`validate_policy` on ``request.policy``

  Agora adds, after those: the execution id; ``input`` only for callable languages; argv,
  environment names/values (each name must be in the policy's allow-list → :class:`Rejected`),
  the working directory; request limits at most the policy's (→ ``Rejected``); the size of
  source and stdin.
"""

from __future__ import annotations

from typing import Final

from hub.core.execution.capabilities import BackendCapabilities, ExecutionLanguage
from hub.core.execution.errors import (
    InvalidRequest,
    Rejected,
    UnsupportedLanguage,
    UnsupportedPolicy,
)
from hub.core.execution.policy import SandboxPolicy, normalise_workspace_path, validate_env_name
from hub.core.execution.request import ExecutionRequest, GuestModule, ModuleBlob, Source

__all__ = [
    "CALLABLE_LANGUAGES",
    "MAX_ARGV_BYTES",
    "MAX_ENV_BYTES",
    "MAX_SOURCE_BYTES",
    "MAX_STDIN_BYTES",
    "validate_policy",
    "validate_request",
]

MAX_ID_BYTES: Final = 256
MAX_SOURCE_BYTES: Final = 1024 * 1024
MAX_STDIN_BYTES: Final = 16 * 1024 * 1024
MAX_ARGV_BYTES: Final = 256 * 1024
MAX_ENV_BYTES: Final = 256 * 1024
# Languages whose programs are called with a JSON ``input`` and may return a ``value``.
CALLABLE_LANGUAGES: Final[frozenset[ExecutionLanguage]] = frozenset(
    {
        ExecutionLanguage.RUST,
        ExecutionLanguage.JAVASCRIPT,
        ExecutionLanguage.TYPESCRIPT,
        ExecutionLanguage.WASM,
        ExecutionLanguage.PYTHON,
    }
)


def validate_policy(policy: SandboxPolicy, caps: BackendCapabilities) -> None:
    """Refuse ``policy`` if ``caps`` cannot enforce it (see the module docstring for the order).

    Raises :class:`UnsupportedPolicy` naming the first control that cannot be enforced
    (``details['control']``).
    """
    if policy.network == "disabled" and not caps.enforces_network:
        raise UnsupportedPolicy(
            "network access is disabled by the policy but this backend cannot enforce that",
            control="network",
        )
    if policy.filesystem.restricted and not caps.enforces_filesystem:
        raise UnsupportedPolicy(
            f"the policy restricts the filesystem ({policy.filesystem.mode}) but this backend "
            "cannot enforce filesystem restrictions (only mode 'host' runs here)",
            control="filesystem",
        )
    if not caps.enforces_environment:
        raise UnsupportedPolicy(
            "this backend cannot enforce an environment policy (it would pass the host "
            "environment through)",
            control="environment",
        )
    if not caps.enforces_timeout:
        raise UnsupportedPolicy("this backend cannot enforce timeouts", control="timeout")
    if policy.filesystem.mode not in caps.filesystem_modes:
        raise UnsupportedPolicy(
            f"this backend cannot provide filesystem mode {policy.filesystem.mode!r} "
            f"(it offers {sorted(caps.filesystem_modes)})",
            control="filesystem",
        )
    if policy.memory_bytes is not None and not caps.enforces_memory:
        raise UnsupportedPolicy(
            "the policy sets a memory limit but this backend cannot enforce one",
            control="memory",
        )
    if policy.pids is not None and not caps.enforces_pids:
        raise UnsupportedPolicy(
            "the policy sets a process-count limit but this backend cannot enforce one",
            control="pids",
        )
    if policy.cpus is not None and not caps.enforces_cpu:
        raise UnsupportedPolicy(
            "the policy sets a cpu limit but this backend cannot enforce one", control="cpu"
        )


def validate_request(request: ExecutionRequest, caps: BackendCapabilities) -> None:
    """Refuse ``request`` unless ``caps`` can run it as asked (order: module docstring).

    Raises :class:`UnsupportedLanguage`, :class:`InvalidRequest` (``details['field']``),
    :class:`UnsupportedPolicy` or :class:`Rejected`.
    """
    language = request.language
    if language not in caps.languages:
        raise UnsupportedLanguage(
            f"this backend does not run {language.value!r} "
            f"(it runs {sorted(lang.value for lang in caps.languages)})",
            language=language.value,
            supported=sorted(lang.value for lang in caps.languages),
        )
    payload = request.payload
    is_module = isinstance(payload, GuestModule | ModuleBlob)
    if is_module and language != ExecutionLanguage.WASM:
        raise InvalidRequest(
            f"a guest module can only run as 'wasm', not {language.value!r}", field="module"
        )
    if language == ExecutionLanguage.WASM and isinstance(payload, Source):
        raise InvalidRequest("'wasm' runs a guest module, not source text", field="source")
    validate_policy(request.policy, caps)
    _check_request_fields(request)


def _check_request_fields(request: ExecutionRequest) -> None:
    exec_id = request.exec_id
    if (
        not isinstance(exec_id, str)
        or not exec_id
        or len(exec_id.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES
        or any(ord(c) < 0x20 or c == "\x7f" for c in exec_id)
    ):
        raise InvalidRequest(
            f"execId must be 1-{MAX_ID_BYTES} UTF-8 bytes without control characters",
            field="execId",
        )
    if request.has_input and request.language not in CALLABLE_LANGUAGES:
        raise InvalidRequest(
            f"input is only for callable languages; {request.language.value!r} is not callable",
            field="input",
        )
    payload = request.payload
    if isinstance(payload, Source):
        if "\x00" in payload.text:
            raise InvalidRequest("source must not contain NUL", field="source")
        if len(payload.text.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
            raise InvalidRequest(f"source is larger than {MAX_SOURCE_BYTES} bytes", field="source")
    argv_bytes = 0
    for arg in request.argv:
        if not isinstance(arg, str) or "\x00" in arg:
            raise InvalidRequest("argv items must be strings without NUL", field="argv")
        argv_bytes += len(arg.encode("utf-8", "surrogatepass")) + 1
    if argv_bytes > MAX_ARGV_BYTES:
        raise InvalidRequest(f"argv is larger than {MAX_ARGV_BYTES} bytes", field="argv")
    env_bytes = 0
    allowed = request.policy.environment
    for name, value in request.env.items():
        validate_env_name(name, "env")
        if not isinstance(value, str) or "\x00" in value:
            raise InvalidRequest(f"env value of {name!r} must be a string without NUL", field="env")
        if not allowed.allows(name):
            raise Rejected(
                f"environment variable {name!r} is not in the policy's allow list",
                field="env",
                name=name,
            )
        env_bytes += len(name) + len(value.encode("utf-8", "surrogatepass")) + 2
    if env_bytes > MAX_ENV_BYTES:
        raise InvalidRequest(f"env is larger than {MAX_ENV_BYTES} bytes", field="env")
    if request.cwd is not None:
        normalise_workspace_path(request.cwd, "cwd")
    if request.stdin is not None and len(request.stdin) > MAX_STDIN_BYTES:
        raise InvalidRequest(f"stdin is larger than {MAX_STDIN_BYTES} bytes", field="stdin")
    policy = request.policy
    for field, amount, limit, low in (
        ("timeoutMs", request.timeout_ms, policy.timeout_ms, 1),
        ("maxStdout", request.max_stdout, policy.max_stdout_bytes, 0),
        ("maxStderr", request.max_stderr, policy.max_stderr_bytes, 0),
    ):
        if amount is None:
            continue
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < low:
            raise InvalidRequest(f"{field} must be an integer >= {low}", field=field)
        if amount > limit:
            raise Rejected(
                f"{field} {amount} is above the policy's limit {limit}",
                field=field,
                limit=limit,
                requested=amount,
            )
