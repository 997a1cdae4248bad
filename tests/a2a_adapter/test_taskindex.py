"""a2a_adapter.taskindex: the derived task index agrees with a fold of the log, whether it was
kept up to date by the listener or rebuilt from the log; ListTasks reads it."""

from __future__ import annotations

from typing import Any

from a2a.types.a2a_pb2 import (
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
)

from a2a_adapter.app import A2AService
from a2a_adapter.store import TaskRef, load_view
from a2a_adapter.taskindex import TaskIndex
from hub.core.events import (
    Completed,
    Event,
    MessagePayload,
    MessagePosted,
    NeedWork,
    WorkCancelled,
    WorkClaimed,
    WorkPublished,
)
from hub.workspaces import Workspaces
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory, open_client


def steps(i: int) -> list[Event]:
    cid = f"t-{i}"
    events: list[Event] = [NeedWork(correlation_id=cid, payload={"n": i})]
    if i % 3:
        events.append(WorkClaimed(correlation_id=cid))
        art = {"artifactId": "a", "parts": [{"text": f"x{i}"}]}
        events.append(WorkPublished(correlation_id=cid, payload=art))
        events.append(WorkPublished(correlation_id=cid, payload={**art, "append": True}))
    if i % 3 == 2:
        events.append(Completed(correlation_id=cid, payload="done"))
    if i % 5 == 4:
        events.append(WorkCancelled(correlation_id=cid))
    events.append(MessagePosted(payload=MessagePayload(text="chatter, no task")))
    return events


async def test_incremental_and_rebuilt_indexes_equal_the_fold(workspaces: Workspaces) -> None:
    live = TaskIndex(workspaces)
    live.install()
    try:
        await workspaces.publish(WORKSPACE, steps(0), producer="a")
        await live.tasks(WORKSPACE)  # built now; later events arrive through the listener
        for i in range(1, 12):
            await workspaces.publish(WORKSPACE, steps(i), producer="a")
        followed = await live.tasks(WORKSPACE)
        rebuilt = await TaskIndex(workspaces).tasks(WORKSPACE)  # no listener: from the log
        assert followed.seq == rebuilt.seq == await workspaces.head(WORKSPACE)
        assert len(followed) == len(rebuilt) == 12
        for i in range(12):
            folded = await load_view(workspaces, TaskRef(WORKSPACE, "work", 0), f"t-{i}")
            assert folded is not None
            for index in (followed, rebuilt):
                view = index.view(f"t-{i}")
                assert view is not None and view.task() == folded.task(), i
        newest = [v.task_id for _, v in followed.newest()]
        assert newest == [v.task_id for _, v in rebuilt.newest()]
        assert len(newest) == 12
        stamps = [v.status_millis for _, v in followed.newest()]
        assert stamps == sorted(stamps, reverse=True)
    finally:
        live.uninstall()


async def test_a_gap_in_the_listener_is_caught_up_from_the_log(workspaces: Workspaces) -> None:
    index = TaskIndex(workspaces)
    index.install()
    try:
        await workspaces.publish(WORKSPACE, steps(1), producer="a")
        tasks = await index.tasks(WORKSPACE)
        index.uninstall()  # events committed now reach the index only through the log
        await workspaces.publish(WORKSPACE, steps(2), producer="a")
        index.install()
        await workspaces.publish(WORKSPACE, steps(4), producer="a")  # a gap: ignored live
        assert tasks.view("t-2") is None
        tasks = await index.tasks(WORKSPACE)
        assert tasks.seq == await workspaces.head(WORKSPACE)
        assert {v.task_id for _, v in tasks.newest()} == {"t-1", "t-2", "t-4"}
    finally:
        index.uninstall()


async def test_list_tasks_pages_and_a_foreign_context_is_empty(
    workspaces: Workspaces, service: A2AService, token: TokenFactory
) -> None:
    for i in range(7):
        await workspaces.publish(WORKSPACE, steps(i), producer="a")
    await workspaces.publish("elsewhere", steps(99), producer="a")
    async with open_client(service.url, token()) as client:
        seen: list[str] = []
        page_token = ""
        while True:
            page = await client.list_tasks(
                ListTasksRequest(context_id=WORKSPACE, page_size=3, page_token=page_token)
            )
            assert page.total_size == 7
            seen.extend(t.id for t in page.tasks)
            page_token = page.next_page_token
            if not page_token:
                break
        assert sorted(seen) == sorted(f"t-{i}" for i in range(7))
        assert len(seen) == 7
        # A context outside the token: an empty page, as for a context that does not exist.
        for context in ("elsewhere", "no-such-workspace"):
            empty = await client.list_tasks(ListTasksRequest(context_id=context))
            assert list(empty.tasks) == [] and empty.total_size == 0
        # Without a context: only the token's workspace.
        mine = await client.list_tasks(ListTasksRequest(page_size=100))
        assert {t.context_id for t in mine.tasks} == {WORKSPACE}


async def test_a_retry_with_a_star_token_and_no_context_is_the_same_task(
    workspaces: Workspaces, service: A2AService, token: TokenFactory
) -> None:
    def send() -> SendMessageRequest:
        return SendMessageRequest(
            message=Message(message_id="m-retry", role=Role.ROLE_USER, parts=[Part(text="hi")]),
            configuration=SendMessageConfiguration(return_immediately=True),
        )

    async with open_client(service.url, token(workspaces=("*",)), streaming=False) as client:
        first = [r async for r in client.send_message(send())]
        again = [r async for r in client.send_message(send())]
    assert first[0].task.id == again[0].task.id
    assert first[0].task.context_id == again[0].task.context_id
    assert first[0].task.context_id.startswith("a2a-")
    made = [w for w in await workspaces.store.workspaces() if w.startswith("a2a-")]
    assert made == [first[0].task.context_id]


async def test_reads_of_an_indexed_workspace_do_not_touch_the_log(
    workspaces: Workspaces, service: A2AService, token: TokenFactory
) -> None:
    for i in range(5):
        await workspaces.publish(WORKSPACE, steps(i), producer="a")
    store = workspaces.store
    reads: list[int] = []
    original = store.read_batch

    async def counting(workspace: str, *args: Any, **kwargs: Any) -> Any:
        # Only this workspace's: the revocation follower polls the system workspace meanwhile.
        if workspace == WORKSPACE:
            reads.append(1)
        return await original(workspace, *args, **kwargs)

    async with open_client(service.url, token()) as client:
        await client.list_tasks(ListTasksRequest(context_id=WORKSPACE))  # builds the index
        await workspaces.publish(WORKSPACE, steps(5), producer="a")  # arrives by the listener
        store.read_batch = counting  # type: ignore[method-assign]
        try:
            for _ in range(3):
                page = await client.list_tasks(ListTasksRequest(context_id=WORKSPACE))
                assert page.total_size == 6
                task = await client.get_task(GetTaskRequest(id="t-5"))
                assert task.id == "t-5"
        finally:
            store.read_batch = original  # type: ignore[method-assign]
    assert reads == []
