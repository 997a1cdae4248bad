"""A small A2A agent built on the a2a-sdk server, for the bridge tests and the benchmark.

It echoes the user's text: WORKING, an artifact ``echo: <text>``, COMPLETED. A text starting
with ``ask`` first asks for input (``which one?``) and echoes the answer when it comes;
``burst N`` sends N artifact chunks (for the benchmark).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Generator

import uvicorn
from a2a.helpers.proto_helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    TaskState,
)
from starlette.applications import Starlette


class EchoExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        if task is None:
            assert context.message is not None
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        text = context.get_user_input()
        waiting = task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        if text.startswith("burst "):  # the benchmark: N artifact updates, then done
            await updater.start_work()
            for i in range(int(text.split()[1])):
                await updater.add_artifact(
                    [Part(text=f"chunk {i}")], artifact_id="burst", append=i > 0
                )
            await updater.complete()
            return
        if text.startswith("ask") and not waiting:
            await updater.requires_input(updater.new_agent_message([Part(text="which one?")]))
            return
        await updater.start_work()
        await updater.add_artifact([Part(text=f"echo: {text}")], name="echo")
        await updater.complete(updater.new_agent_message([Part(text="done")]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@contextlib.asynccontextmanager
async def echo_agent(host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Run the echo agent on a free loopback port; yields its card URL."""
    import asyncio

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(64)
    sock.setblocking(False)
    base = f"http://{host}:{sock.getsockname()[1]}"
    card = AgentCard(
        name="echo",
        description="Echoes text back",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=base + "/rpc", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="Echo", description="Echo", tags=["echo"])],
    )
    handler = DefaultRequestHandler(EchoExecutor(), InMemoryTaskStore(), card)
    app = Starlette(
        routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/rpc")]
    )
    server = _Server(
        uvicorn.Config(app, log_config=None, log_level="warning", lifespan="off", ws="none")
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield base + "/.well-known/agent-card.json"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        await handler.aclose()
        sock.close()
