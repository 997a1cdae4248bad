"""The viewer in headless Chromium against a real ``agora serve``: sign in, see only the
readable workspaces, watch two agents' live session appear, filter it, slide to an earlier seq
and see the earlier file content, open a diff, open an execution with its output, verify the
chain, export, and open a deep link. Screenshots are kept (tests/viewer/browser.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys

from tests.support.hub import HubProcess
from tests.support.paths import REPO
from tests.support.peer import ExecPeer, Peer, message, open_peer, peer
from tests.support.require import require
from tests.viewer.browser import Browser, sign_in

WS = "demo"


def write(path: str, text: str) -> dict[str, object]:
    return {"kind": "fileWritten", "payload": {"path": path, "text": text}}


async def acked(p: Peer, event: dict[str, object], workspace: str = WS) -> int:
    reply = await p.publish(workspace, event)
    assert reply["op"] == "ack", reply
    seq: int = reply["seq"]
    return seq


async def test_sign_in_lists_only_readable_workspaces(hub: HubProcess, browser: Browser) -> None:
    from playwright.async_api import expect

    async with peer(hub.url, hub.token("alice")) as alice:
        await acked(alice, message("hello"))
        await acked(alice, message("hidden"), "secret")
    page = browser.page
    await sign_in(browser, hub.a2a_url, "not-a-token")
    await expect(page.get_by_test_id("signin-error")).to_contain_text("unauthorized")
    await browser.shot("signin")
    await page.get_by_test_id("token").fill(hub.token("auditor", [WS, "other"], ["read"]))
    await page.get_by_role("button", name="Sign in").click()
    table = page.get_by_test_id("workspaces")
    await expect(table.get_by_role("link", name=WS)).to_be_visible()
    await expect(table.get_by_role("link", name="other")).to_be_visible()
    await expect(table).not_to_contain_text("secret")
    await expect(page.get_by_test_id("agent")).to_contain_text("auditor")
    await browser.shot("workspaces")


async def test_live_session_filter_time_travel_diff_and_execution(
    hub: HubProcess, browser: Browser
) -> None:
    from playwright.async_api import expect

    require("bwrap", shutil.which("bwrap") is not None, "the process backend needs bubblewrap")
    page = browser.page
    async with peer(hub.url, hub.token("alice")) as alice:
        first = await acked(alice, write("notes.txt", "version 1\nshared line\n"))
        await sign_in(browser, hub.a2a_url, hub.token("auditor", [WS], ["read"]))
        await page.get_by_role("link", name=WS).click()
        await expect(page.get_by_test_id("live")).to_have_text("● live")
        timeline = page.get_by_test_id("timeline")
        await expect(timeline.locator(".row[data-kind=fileWritten]")).to_have_count(1)

        # Two agents work while the page watches: every event appears live.
        async with open_peer(
            ExecPeer, hub.url, hub.token("bob", [WS], ["read", "write", "exec"], backends=["*"])
        ) as bob:
            await acked(alice, {"kind": "needWork", "correlationId": "task-1"})
            await acked(bob, {"kind": "workClaimed", "correlationId": "task-1"})
            await acked(bob, message("on it", correlationId="task-1"))
            second = await acked(alice, write("notes.txt", "version 2\nshared line\n"))
            await acked(bob, {"kind": "completed", "correlationId": "task-1"})
            await expect(timeline.locator(".row", has_text="on it")).to_be_visible()
            await expect(timeline.locator(".row[data-kind=completed]")).to_have_count(1)
            result = await bob.run(
                WS, backend="process", execId="build-1", source="echo hello-from-exec"
            )
            assert result["status"] == "completed", result
            await expect(timeline.locator(".row[data-kind=execFinished]")).to_have_count(1)
            head = int((await page.get_by_test_id("head").inner_text()).split()[1])
            state_view = page.get_by_test_id("state-view")
            await expect(state_view).to_have_attribute("data-seq", str(head))
            await expect(page.get_by_test_id("members")).to_contain_text("auditor")
            await browser.shot("timeline")

            # Filter: bob's events only, then a text search.
            await page.get_by_test_id("filter-producer").select_option("bob")
            rows = timeline.locator(".row")
            await expect(rows.first.locator(".producer")).to_have_text("bob")
            producers = await rows.locator(".producer").all_inner_texts()
            assert producers and set(producers) == {"bob"}, producers
            await page.get_by_test_id("filter-text").fill("on it")
            await expect(rows).to_have_count(1)
            await browser.shot("filter")
            await page.get_by_test_id("filter-text").fill("")
            await page.get_by_test_id("filter-producer").select_option("")

            # The state now, then slid back to the first seq: the earlier content.
            await page.get_by_test_id("file-notes.txt").click()
            content = page.get_by_test_id("file-content")
            await expect(content).to_contain_text("version 2")
            board = page.get_by_test_id("board")
            card = board.get_by_test_id("item-task-1")
            await expect(card).to_contain_text("owner bob")
            steps = card.get_by_test_id("lifecycle-task-1").locator("li")
            await expect(steps).to_have_count(4)  # needWork, workClaimed, a message, completed
            await expect(steps.first).to_contain_text("needWork")
            await expect(steps.last).to_contain_text("completed")
            await card.click()  # the item's events only
            await expect(page.get_by_test_id("filter-item")).to_have_value("task-1")
            await expect(rows).to_have_count(4)
            await page.get_by_test_id("filter-item").select_option("")
            slider = page.get_by_test_id("seq-slider")
            await slider.focus()
            await slider.press("Home")
            await expect(page.get_by_test_id("state-view")).to_have_attribute(
                "data-seq", str(first)
            )
            await expect(content).to_contain_text("version 1")
            assert f"seq={first}" in page.url
            await expect(board).not_to_contain_text("task-1")
            await browser.shot("state-at-seq")

            # A diff of the file between its two revisions.
            await page.get_by_test_id("follow").check()
            await page.get_by_test_id("tab-diff").click()
            diff = page.get_by_test_id("diff-view")
            await expect(page.get_by_test_id("diff-from")).to_have_value(str(second - 1))
            await expect(diff.locator(".del")).to_have_text("- version 1")
            await expect(diff.locator(".add")).to_have_text("+ version 2")
            await expect(diff).to_contain_text("shared line")
            await browser.shot("diff")

            # The execution: command, output, result.
            await page.get_by_test_id("tab-exec").click()
            await expect(page.get_by_test_id("exec-command")).to_have_text("echo hello-from-exec")
            await expect(page.get_by_test_id("exec-output")).to_contain_text("hello-from-exec")
            await expect(page.get_by_test_id("exec-result")).to_contain_text("completed")
            await browser.shot("execution")

            # The A2A view of the same: the work item and the execution as tasks.
            await page.get_by_test_id("tab-tasks").click()
            tasks = page.get_by_test_id("tasks")
            await expect(tasks.locator("tr", has_text="task-1")).to_contain_text("COMPLETED")
            await expect(tasks.locator("tr", has_text="build-1")).to_contain_text("COMPLETED")

            # The chain's verification and the signed checkpoint.
            await page.get_by_test_id("tab-verify").click()
            await expect(page.get_by_test_id("verify-result")).to_contain_text("chain OK")
            await expect(page.get_by_test_id("verify-view")).to_contain_text("checkpoint size")
            await browser.shot("verify")

            # Export: the JSON Lines download is the stored log.
            async with page.expect_download() as download_info:
                await page.get_by_test_id("export").click()
            download = await download_info.value
            assert download.suggested_filename == f"{WS}.jsonl"
            lines = (await download.path()).read_text().splitlines()
            events = await bob.log(WS)
            assert len(lines) >= second and lines[0].startswith("{")
            assert [e["seq"] for e in events[: len(lines)]] == list(range(1, len(lines) + 1))


async def test_a_deep_link_opens_the_state_at_a_seq(hub: HubProcess, browser: Browser) -> None:
    from playwright.async_api import expect

    async with peer(hub.url, hub.token("alice")) as alice:
        old = await acked(alice, write("src/a.py", "print('old')\n"))
        await acked(alice, write("src/a.py", "print('new')\n"))
    page = browser.page
    link = f"/ui/w/{WS}?seq={old}&file=src%2Fa.py"
    await sign_in(browser, hub.a2a_url, hub.token("auditor", [WS], ["read"]), link)
    await expect(page.get_by_test_id("workspace-name")).to_have_text(WS)
    await expect(page.get_by_test_id("file-content")).to_have_text("print('old')\n")
    await expect(page.get_by_test_id("seq-input")).to_have_value(str(old))
    # Reloading keeps the session (this tab's sessionStorage) and the place.
    await page.reload()
    await expect(page.get_by_test_id("file-content")).to_have_text("print('old')\n")


async def test_a_token_without_read_sees_an_error_not_the_log(
    hub: HubProcess, browser: Browser
) -> None:
    from playwright.async_api import expect

    async with peer(hub.url, hub.token("alice")) as alice:
        await acked(alice, message("private"))
    page = browser.page
    link = f"/ui/w/{WS}"
    await sign_in(browser, hub.a2a_url, hub.token("stranger", ["elsewhere"], ["read"]), link)
    await expect(page.locator(".wsbar .error")).to_contain_text("forbidden")
    await expect(page.get_by_test_id("timeline").locator(".row")).to_have_count(0)


async def test_an_execution_streams_its_output_while_it_runs(
    hub: HubProcess, browser: Browser
) -> None:
    from playwright.async_api import expect

    require("bwrap", shutil.which("bwrap") is not None, "the process backend needs bubblewrap")
    page = browser.page
    token = hub.token("bob", [WS], ["read", "write", "exec"], backends=["*"])
    async with open_peer(ExecPeer, hub.url, token) as bob:
        await acked(bob, message("starting a slow build"))
        await sign_in(
            browser,
            hub.a2a_url,
            hub.token("auditor", [WS], ["read"]),
            f"/ui/w/{WS}?tab=exec&exec=slow-1",
        )
        await expect(page.get_by_test_id("live")).to_have_text("● live")
        result = page.get_by_test_id("exec-result")
        await expect(result).to_have_text("not started at this seq")
        accepted = await bob.exec(
            WS, backend="process", execId="slow-1", source="echo first; sleep 3; echo second"
        )
        assert accepted["op"] == "execAccepted", accepted
        output = page.get_by_test_id("exec-output")
        await expect(output).to_contain_text("first")
        await expect(page.get_by_test_id("exec-result")).to_have_text("running…")
        assert "second" not in await output.inner_text()
        await expect(output).to_contain_text("second")
        await expect(page.get_by_test_id("exec-result")).to_contain_text("completed")


async def test_a_revoked_token_ends_the_session(hub: HubProcess, browser: Browser) -> None:
    from playwright.async_api import expect

    async with peer(hub.url, hub.token("alice")) as alice:
        await acked(alice, message("hello"))
    page = browser.page
    await sign_in(browser, hub.a2a_url, hub.token("auditor", [WS], ["read"]), f"/ui/w/{WS}")
    await expect(page.get_by_test_id("live")).to_have_text("● live")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub", "token", "revoke", "--agent", "auditor",
        "--data", str(hub.data_dir),
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    await expect(page.get_by_test_id("signin-error")).to_contain_text("4401")
    await expect(page.get_by_test_id("token")).to_be_visible()
