"""The A2A 1.0 adapter (server and client bridge), on the official a2a-sdk."""
