"""A waiting task's decision asked in the client (elicitation) and progress while waiting,
through the official Python MCP SDK (mcp 1.30.0) against the real binary over stdio.

Run by tests/e2e/mcp_python.rs, which provides a repository and a mock of the Anthropic API
scripted for two tasks that each ask a question:

    test_elicit.py   (env TB_BIN, TB_SERVER_ENV as JSON, TB_REPO)

Task 1 is seen through with wait_for: its question comes up as an elicitation, which the
callback accepts. Task 2 is run with run_task: the callback declines, the task stays waiting,
wait_for reports it without asking again, and answer_task answers it. Task 3 is only
submitted: no call waits on it, and its question still comes up in the client that submitted
it, whose answer sees it through while the client merely polls get_task.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

PASSED = 0
FAILED = []
ASKED = []
REPLIES = []


def check(cond, what):
    global PASSED
    if cond:
        PASSED += 1
    else:
        FAILED.append(what)
        print(f"FAIL: {what}", flush=True)


async def elicit(context, params):
    ASKED.append(params)
    reply = REPLIES.pop(0) if REPLIES else types.ElicitResult(action="cancel")
    return reply


async def call(session, tool, args, progress=None):
    r = await session.call_tool(tool, args, progress_callback=progress)
    check(not r.isError, f"{tool} {args} succeeds: {r.content}")
    return r.structuredContent


async def main():
    env = json.loads(os.environ["TB_SERVER_ENV"])
    repo = os.environ["TB_REPO"]
    params = StdioServerParameters(command=os.environ["TB_BIN"], args=["mcp", "--concurrency", "1"], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, elicitation_callback=elicit,
                                 client_info=types.Implementation(name="pytest-client", version="1")) as s:
            await s.initialize()

            # Accepted: the answer goes to the agent and the same wait sees the task through.
            t = await call(s, "submit_task", {"prompt": "Add a banner file", "repo": repo})
            tid = t["task_id"]
            lines = []

            async def progress(done, total, message):
                lines.append(message or "")

            REPLIES.append(types.ElicitResult(action="accept", content={"answer": "Blue, please."}))
            w = None
            for _ in range(4):
                w = await call(s, "wait_for", {"task_ids": [tid], "timeout_s": 50}, progress)
                if w["done"] or w["failed"]:
                    break
            check(w["done"] == [tid], f"the task is done after the elicited answer: {w}")
            check(len(ASKED) == 1, f"one elicitation: {len(ASKED)}")
            if ASKED:
                check("red or blue" in ASKED[0].message, f"the question is the form's message: {ASKED[0].message}")
                check(ASKED[0].requestedSchema["required"] == ["answer"], f"free text: {ASKED[0].requestedSchema}")
            got = await call(s, "get_task", {"task_id": tid})
            check(got["questions"][0]["answered_by"] == "elicitation:pytest-client",
                  f"answered by the client's elicitation: {got['questions']}")
            check(any(f"task {tid} running" in l for l in lines), f"progress says it runs: {lines}")
            check(any(f"task {tid} waiting: " in l and "red or blue" in l for l in lines),
                  f"progress carries the question: {lines}")
            check(any(f"task {tid} done" == l for l in lines), f"progress says it is done: {lines}")
            check(all(0 < len(l) <= 200 for l in lines), f"short lines: {lines}")

            # Declined: run_task returns the waiting task; the decision is not asked again.
            REPLIES.append(types.ElicitResult(action="decline"))
            r = await call(s, "run_task", {"prompt": "Add a footer file", "repo": repo})
            t2 = r["task_id"]
            check(r["status"] == "waiting" and r["timed_out"] is False, f"run_task returns the waiting task: {r}")
            check("declined" in (r["task"].get("asked") or ""), f"the reply says it was declined: {r}")
            check(len(ASKED) == 2, f"asked for the second task: {len(ASKED)}")
            w = await call(s, "wait_for", {"task_ids": [t2], "timeout_s": 5})
            check(w["waiting"] == [t2] and len(ASKED) == 2, f"a declined decision is not asked again: {w}")
            a = await call(s, "answer_task", {"task_id": t2, "answer": "Green."})
            check(a["status"] in ("queued", "running"), f"answer_task answers it still: {a}")
            w = await call(s, "wait_for", {"task_ids": [t2], "timeout_s": 50})
            check(w["done"] == [t2], f"the second task is done: {w}")
            got = await call(s, "get_task", {"task_id": t2})
            check(got["questions"][0]["answered_by"] == "mcp:pytest-client", f"answered by the planner: {got['questions']}")

            # Submitted and left: the submitter is asked although it waits in no call.
            REPLIES.append(types.ElicitResult(action="accept", content={"answer": "Red."}))
            t = await call(s, "submit_task", {"prompt": "Add a header file", "repo": repo})
            t3 = t["task_id"]
            got = None
            for _ in range(180):
                got = await call(s, "get_task", {"task_id": t3})
                if got["status"] in ("done", "failed"):
                    break
                await asyncio.sleep(0.5)
            check(got["status"] == "done", f"the third task is done with no wait_for: {got}")
            check(len(ASKED) == 3, f"the submitter was asked: {len(ASKED)}")
            check(got["questions"][0]["answered_by"] == "elicitation:pytest-client",
                  f"answered in the submitting client: {got['questions']}")
    print(f"{PASSED} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    asyncio.run(main())
