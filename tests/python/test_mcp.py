"""TaskBridge through the official Python MCP SDK (mcp 1.30.0), against the real binary.

Run by tests/e2e/mcp_python.rs, which provides a git repository, a loopback mock of the Anthropic
API scripted for a question round trip, and either the stdio command or a running HTTP server:

    test_mcp.py stdio   (env TB_BIN, TB_SERVER_ENV as JSON, TB_REPO, TB_LOGS)
    test_mcp.py http    (env TB_URL, TB_TOKEN, TB_REPO, TB_LOGS)
"""

import asyncio
import json
import os
import sys

import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

PASSED = 0
FAILED = []


def check(cond, what):
    global PASSED
    if cond:
        PASSED += 1
    else:
        FAILED.append(what)
        print(f"FAIL: {what}", flush=True)


async def message_handler(message):
    # The SDK hands transport errors (e.g. a non-JSON line on stdout) to this handler and only
    # logs them; a clean stdout is part of the contract, so they fail the run.
    if isinstance(message, Exception):
        check(False, f"transport error: {message!r}")


async def call(session, tool, args):
    r = await session.call_tool(tool, args)
    data = r.structuredContent
    if not r.isError:
        check(data is not None, f"{tool} returns structured content")
        check(json.loads(r.content[0].text) == data, f"{tool} text content is the same JSON")
    return r, data


async def wait_until(session, task_id, statuses):
    for _ in range(10):
        _, w = await call(session, "wait_for", {"task_ids": [task_id], "timeout_s": 50})
        state = w["tasks"][0]["status"]
        if state in statuses:
            return w
    raise AssertionError(f"task {task_id} never reached {statuses}")


async def exercise(session, label):
    init = await session.initialize()
    check(init.serverInfo.name == "taskbridge", f"{label}: server name")
    check("wait_for" in (init.instructions or ""), f"{label}: instructions describe the workflow")
    tools = {t.name: t for t in (await session.list_tools()).tools}
    for name in ["submit_task", "submit_batch", "get_task", "get_task_result", "get_task_logs",
                 "wait_for", "answer_task", "list_tasks", "queue_status", "list_workers",
                 "restart_worker", "add_task_note", "cancel_task", "retry_task", "clear_finished",
                 "list_models", "set_default_model", "ping"]:
        check(name in tools, f"{label}: tool {name} listed")
    check(tools["submit_task"].inputSchema["required"] == ["prompt"], f"{label}: submit_task requires prompt")
    # A typed reply declares its shape; the SDK checks every structuredContent against it (and
    # raises on a mismatch), so each call below is also a check of the schema.
    for name, tool in tools.items():
        schema = tool.outputSchema or {}
        check(schema.get("type") == "object" and schema.get("properties"), f"{label}: {name} has an output schema")
    result_schema = tools["get_task_result"].outputSchema
    check("usage" in result_schema["required"] and "files_touched" in result_schema["properties"],
          f"{label}: get_task_result's schema describes the result")

    repo = os.environ["TB_REPO"]
    r, t = await call(session, "submit_task", {"prompt": "Add a banner file", "repo": repo, "title": "banner"})
    # The embedded worker may have claimed it already: pickup takes milliseconds.
    check(not r.isError and t["status"] in ("queued", "running"), f"{label}: submit_task queues: {t['status']}")
    tid = t["task_id"]
    check(isinstance(tid, int), f"{label}: ids are integers")

    w = await wait_until(session, tid, ["waiting", "failed", "done"])
    check(w["waiting"] == [tid], f"{label}: the task waits with a question: {w}")
    check("red or blue" in (w["tasks"][0]["question"] or ""), f"{label}: the question is returned")
    _, got = await call(session, "get_task", {"task_id": tid})
    check(got["question"] == w["tasks"][0]["question"], f"{label}: get_task shows the question")

    # A task held back by the waiting one: its notes, priority, cancel and retry, through the
    # binary; cancelled again before the answer, so it never reaches the agent.
    _, b = await call(session, "submit_task", {"prompt": "Then a footer", "repo": repo, "depends_on": [tid]})
    bid = b["task_id"]
    check(b["status"] == "queued", f"{label}: a task depending on a waiting one stays queued: {b}")
    _, n = await call(session, "add_task_note", {"task_id": bid, "note": "keep it short"})
    _, got = await call(session, "get_task", {"task_id": bid})
    check([x["note"] for x in got["notes"]] == ["keep it short"], f"{label}: add_task_note is on the task: {got['notes']}")
    _, p = await call(session, "set_task_priority", {"task_id": bid, "priority": 7})
    check(p["priority"] == 7, f"{label}: set_task_priority answers the new priority: {p}")
    _, listed = await call(session, "list_tasks", {"status": "queued"})
    check([(t["task_id"], t["priority"]) for t in listed["tasks"]] == [(bid, 7)],
          f"{label}: list_tasks shows the queued task with its priority: {listed['tasks']}")
    _, c = await call(session, "cancel_task", {"task_id": bid})
    check(c["status"] == "cancelled", f"{label}: cancel_task cancels: {c}")
    _, rt = await call(session, "retry_task", {"task_id": bid})
    check(rt["status"] == "queued", f"{label}: retry_task requeues a cancelled task: {rt}")
    _, c = await call(session, "cancel_task", {"task_id": bid})
    check(c["status"] == "cancelled", f"{label}: cancelled again: {c}")

    r, a = await call(session, "answer_task", {"task_id": tid, "answer": "Blue, please."})
    check(not r.isError and a["status"] in ("queued", "running"), f"{label}: answer_task requeues")
    w = await wait_until(session, tid, ["done", "failed"])
    check(w["done"] == [tid], f"{label}: the task is done after the answer: {w}")

    _, res = await call(session, "get_task_result", {"task_id": tid})
    files = [f["path"] for f in res["files_touched"]]
    check(files == ["banner.txt"], f"{label}: files_touched from git: {files}")
    check(res["summary"] == "Added a blue banner.", f"{label}: summary from the result block")
    check("+blue banner" in res["diff"] and res["diff_truncated"] is False, f"{label}: diff")
    check(res["usage"]["output_tokens"] > 0 and res["usage"]["cost_usd"] > 0, f"{label}: usage and cost")
    check(res["branch"] == f"taskbridge/task-{tid}" and len(res["commit"] or "") == 40, f"{label}: branch and commit")
    _, cut = await call(session, "get_task_result", {"task_id": tid, "max_diff_bytes": 10})
    check(len(cut["diff"]) == 10 and cut["diff_truncated"] is True, f"{label}: diff truncation")

    # Logs, paged by offset, add up to the log file.
    with open(os.path.join(os.environ["TB_LOGS"], f"{tid}.log"), encoding="utf-8") as f:
        whole = f.read()
    text, offset = "", 0
    while True:
        _, page = await call(session, "get_task_logs", {"task_id": tid, "offset": offset, "max_bytes": 256})
        text += page["text"]
        offset = page["next_offset"]
        if page["eof"]:
            break
    check(text == whole and len(whole) > 0, f"{label}: paged logs equal the log file")
    _, tail = await call(session, "get_task_logs", {"task_id": tid})
    check(whole.endswith(tail["text"]) and tail["running"] is False, f"{label}: log tail")

    # Errors name the problem, write nothing, and the server keeps serving.
    _, before = await call(session, "queue_status", {})
    for tool, args, needle in [
        ("get_task", {"task_id": 999999}, "does not exist"),
        ("answer_task", {"task_id": tid, "answer": "again"}, "is done"),
        ("submit_batch", {"tasks": [{"prompt": f"t{i}", "repo": repo} for i in range(21)]}, "1 to 20"),
        ("wait_for", {"task_ids": [tid], "timeout_s": 500}, "timeout_s"),
        ("get_task", {"task_id": "x"}, "task_id"),
        ("submit_task", {"prompt": "x", "repo": "/"}, "not inside a git repository"),
    ]:
        r = await session.call_tool(tool, args)
        text_out = r.content[0].text if r.content else ""
        check(r.isError is True and needle in text_out, f"{label}: {tool} {args} refused with '{needle}': {text_out}")
        _, ping = await call(session, "ping", {})
        check(ping["version"], f"{label}: still serving after a refused {tool}")
    _, after = await call(session, "queue_status", {})
    check(before["total"] == after["total"], f"{label}: refused calls wrote nothing")

    _, cleared = await call(session, "clear_finished", {"statuses": ["cancelled"]})
    check(cleared["cleared"] == [bid], f"{label}: clear_finished clears the cancelled task only: {cleared}")
    _, gone = await call(session, "list_tasks", {})
    check([t["task_id"] for t in gone["tasks"]] == [tid], f"{label}: the done task is kept: {gone['tasks']}")


async def run_stdio():
    env = json.loads(os.environ["TB_SERVER_ENV"])
    params = StdioServerParameters(command=os.environ["TB_BIN"], args=["mcp", "--concurrency", "1"], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, message_handler=message_handler) as session:
            await exercise(session, "stdio")


async def run_http():
    url, token = os.environ["TB_URL"], os.environ["TB_TOKEN"]
    async with streamablehttp_client(url, headers={"Authorization": f"Bearer {token}"}) as (read, write, _):
        async with ClientSession(read, write, message_handler=message_handler) as session:
            await exercise(session, "http")

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    # One connection a request, each status from a connection of its own: once, under CI's load,
    # the last request on a reused connection got a ReadError (not reproduced here since; curl
    # reusing one connection across these refusals gets every answer).
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
              "Connection": "close"}
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient() as hc:
        r = await hc.post(url, json=init, headers=accept)
        check(r.status_code == 401, f"http: no token -> 401 (got {r.status_code})")
        check("Bearer" in r.headers.get("www-authenticate", ""), "http: 401 carries WWW-Authenticate")
        r = await hc.post(url, json=init, headers={**accept, "Authorization": "Bearer wrong"})
        check(r.status_code == 401, f"http: wrong token -> 401 (got {r.status_code})")
        r = await hc.post(url, json=init, headers={**accept, **auth, "Host": "evil.example"})
        check(r.status_code == 403, f"http: foreign Host -> 403 (got {r.status_code})")
        r = await hc.post(url, json=init, headers={**accept, **auth, "Origin": "http://evil.example"})
        check(r.status_code == 403, f"http: foreign Origin -> 403 (got {r.status_code})")
        r = await hc.post(url, json=init, headers={**accept, "Host": "evil.example"})
        check(r.status_code == 403, f"http: the Host check comes before the token check (got {r.status_code})")
        r = await hc.post(url, json=init, headers={**accept, **auth, "Origin": "http://localhost:3000"})
        check(r.status_code == 200, f"http: loopback Origin with the token -> 200 (got {r.status_code})")


def main():
    mode = sys.argv[1]
    asyncio.run(run_stdio() if mode == "stdio" else run_http())
    print(f"{PASSED} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
