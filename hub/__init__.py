"""Agora: an event-sourced collaboration hub for multi-agent workspaces."""

__version__ = "0.1.0"
