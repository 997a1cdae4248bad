"""Admission: the caps on open connections, in all and per agent (``[limits]``).

The hub counts every WebSocket connection from its handshake to its end, and every
authenticated one under its agent. Over ``max_connections`` the handshake is refused with HTTP
503 (checked before the upgrade, so a refused client costs no session); over
``max_connections_per_agent`` the connection is told ``busy`` and closed with 1013 right after
its ``hello`` (the agent is only known then). Touched only from the event loop.
"""

from __future__ import annotations

__all__ = ["ConnectionAdmission"]


class ConnectionAdmission:
    """Counts of open connections, in all and per authenticated agent."""

    __slots__ = ("_agents", "max_connections", "max_per_agent", "open")

    def __init__(self, max_connections: int, max_per_agent: int) -> None:
        self.max_connections = max_connections
        self.max_per_agent = max_per_agent
        self.open = 0
        self._agents: dict[str, int] = {}

    @property
    def full(self) -> bool:
        """Whether a new handshake must be refused."""
        return self.open >= self.max_connections

    def connected(self) -> None:
        self.open += 1

    def disconnected(self) -> None:
        self.open -= 1

    def agent_connections(self, agent: str) -> int:
        return self._agents.get(agent, 0)

    def admit_agent(self, agent: str) -> bool:
        """Count one more connection of ``agent``; False (not counted) over the cap."""
        count = self._agents.get(agent, 0)
        if count >= self.max_per_agent:
            return False
        self._agents[agent] = count + 1
        return True

    def release_agent(self, agent: str) -> None:
        left = self._agents.get(agent, 0) - 1
        if left > 0:
            self._agents[agent] = left
        else:
            self._agents.pop(agent, None)
