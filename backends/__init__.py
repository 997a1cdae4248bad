"""Execution backends (the CodeExecutor protocol and its implementations)."""
