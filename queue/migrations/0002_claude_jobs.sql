-- Schema version 2: jobs of the reverse bridge (`taskbridge claude-mcp`), questions that OpenCode
-- (or any MCP client) sends to Claude in the background. A job is run by the process that accepted
-- it; `owner_*` name that process so a restart can tell a job whose runner died from one that is
-- still being worked on by another live bridge.
CREATE TABLE claude_jobs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    status        TEXT    NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    request       TEXT    NOT NULL,
    result        TEXT,
    error         TEXT,
    owner_host    TEXT    NOT NULL,
    owner_pid     INTEGER NOT NULL,
    owner_started TEXT,
    created_at    REAL    NOT NULL,
    started_at    REAL,
    finished_at   REAL
);
CREATE INDEX claude_jobs_open ON claude_jobs (status) WHERE status IN ('queued', 'running');
