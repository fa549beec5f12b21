"""The Python baseline for benches/mcp.rs: a FastMCP (mcp 1.30.0) server with one get_task tool
that reads the same row from the same TaskBridge database, over stdio."""

import json
import sqlite3
import sys

from mcp.server.fastmcp import FastMCP

db = sqlite3.connect(sys.argv[1], check_same_thread=False)
db.row_factory = sqlite3.Row
server = FastMCP("fastmcp-baseline")


@server.tool()
def get_task(task_id: int) -> dict:
    """Everything about a task."""
    row = db.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
    if row is None:
        raise ValueError(f"task {task_id} does not exist")
    task = dict(row)
    task["depends_on"] = [r[0] for r in db.execute("SELECT depends_on FROM task_deps WHERE task_id = ?", (task_id,))]
    task["notes"] = [dict(r) for r in db.execute("SELECT note, created_at FROM task_notes WHERE task_id = ?", (task_id,))]
    if task.get("result"):
        task["result"] = json.loads(task["result"])
    return task


if __name__ == "__main__":
    server.run()
