"""Token revocation on PostgreSQL with two ``agora serve`` nodes: ``agora token revoke
--store URL`` (a third process) appends to the shared log; both nodes pick it up, one closes
the live connection using the token, the other refuses it at ``hello``."""

from __future__ import annotations

import json
from pathlib import Path

from tests.hub.server.test_revocation import agora, closed_with, errors, token_id, until_refused
from tests.support.hub import StartHub
from tests.support.peer import peer
from tests.support.tokens import mint


async def test_revocation_reaches_every_node(
    pg_url: str, start_node: StartHub, tmp_path: Path
) -> None:
    store = ["--store", pg_url, "--data", str(tmp_path / "cli")]  # the CLI's blobs stay here
    a = start_node(pg_url)
    b = start_node(pg_url)
    token = mint("mallory")
    async with peer(b.url, token) as victim, peer(a.url, mint("alice")) as bystander:
        assert (await victim.call("subscribe", workspace="w"))["op"] == "subscribed"
        out = await agora("token", "revoke", f"--token-id={token_id(token)}", "--json", store=store)
        assert json.loads(out)["payload"]["tokenId"] == token_id(token)
        frames, code, reason = await closed_with(victim)
        assert (code, reason) == (4401, "unauthorized: revoked")
        assert [e["details"]["reason"] for e in errors(frames)] == ["revoked"]
        frame, code, _ = await until_refused(a.url, token)
        assert frame["details"]["reason"] == "revoked" and code == 4401
        assert (await bystander.call("state", workspace="w"))["op"] == "state"
    listed = await agora("token", "revoked", store=store)
    assert f"tokenId={token_id(token)}" in listed
