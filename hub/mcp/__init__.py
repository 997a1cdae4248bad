"""The MCP door: Agora's workspaces as Model Context Protocol tools and resources (docs/mcp.md).

Built on the official MCP Python SDK (``mcp``) and on the Python client (:mod:`hub.client`):
every MCP connection is one hub connection with its token, so every tool call acts as that
token's agent and writes the same events a WebSocket client would.

- :mod:`hub.mcp.tools`: the tools (typed argument Structs, one JSON Schema source) and what
  each one does through a :class:`hub.client.Session`;
- :mod:`hub.mcp.resources`: ``agora://<workspace>/files/<path>`` and
  ``agora://<workspace>/timeline``, and the watchers behind resource subscriptions;
- :mod:`hub.mcp.server`: the SDK's low-level ``Server`` wired to both, and ``agora mcp``'s
  stdio loop;
- :mod:`hub.mcp.http`: the Streamable HTTP transport at ``/mcp`` on the hub's HTTP port
  (bearer capability token, one hub connection per MCP session, a cap on sessions).
"""
