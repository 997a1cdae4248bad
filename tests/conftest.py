"""Fixtures for every test. What tests share besides fixtures is in tests/support/ (imported as
plain modules, never from a conftest); its assertions are rewritten like a conftest's, so a
failing check there explains itself."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("tests.support")
