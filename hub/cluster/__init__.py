"""Several ``agora serve`` nodes over one shared log (PostgreSQL).

One concept per module:

- :mod:`hub.cluster.settings`: a node's id (the timing is ``[cluster]`` in
  :class:`hub.config.ClusterConfig`).
- :mod:`hub.cluster.follower`: events other nodes commit, delivered to this node's subscribers
  (LISTEN/NOTIFY hints, coalesced per workspace, read back from the log).
- :mod:`hub.cluster.heartbeat`: the ``nodes`` table: beats, dead nodes, reaping each dead node
  exactly once.
- :mod:`hub.cluster.interrupted`: closing the executions a dead node left open (started, or
  accepted and never started).
- :mod:`hub.cluster.members`: recording as gone the members a dead node left present.
- :mod:`hub.cluster.node`: these together, as :class:`hub.server.app.Hub` runs them.

Nothing here is imported by a hub on SQLite (the modules past ``settings`` load asyncpg).
"""
