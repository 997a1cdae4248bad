"""Subcommands of ``agora``; see :mod:`hub.cli`."""
