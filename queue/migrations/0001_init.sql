-- Schema version 1. Never edit a shipped migration: add the next file instead.
-- Times are REAL seconds since the Unix epoch, read with unixepoch('subsec') inside the writing
-- transaction so that lease arithmetic never uses a clock read before the write lock was held.
CREATE TABLE tasks (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    title              TEXT    NOT NULL,
    prompt             TEXT    NOT NULL,
    repo               TEXT    NOT NULL,
    base               TEXT    NOT NULL,
    priority           INTEGER NOT NULL DEFAULT 0,
    model              TEXT,
    agent              TEXT,
    readonly           INTEGER NOT NULL DEFAULT 0,
    no_network         INTEGER NOT NULL DEFAULT 0,
    no_shell           INTEGER NOT NULL DEFAULT 0,
    worktree_keep      INTEGER NOT NULL DEFAULT 0,
    max_attempts       INTEGER NOT NULL DEFAULT 2,
    timeout_s          INTEGER NOT NULL DEFAULT 3600,
    question_timeout_s INTEGER,
    request_id         TEXT UNIQUE,
    status             TEXT    NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'running', 'waiting', 'done', 'failed', 'cancelled')),
    question           TEXT,
    asked_at           REAL,
    pending_answer     TEXT,
    session_id         TEXT,
    result             TEXT,
    error              TEXT,
    attempts           INTEGER NOT NULL DEFAULT 0,
    worker             TEXT,
    lease_token        INTEGER NOT NULL DEFAULT 0,
    lease_until        REAL,
    not_before         REAL,
    cancel_requested   INTEGER NOT NULL DEFAULT 0,
    failed_dependency  INTEGER,
    agent_pid          INTEGER,
    agent_started      TEXT,
    worker_host        TEXT,
    branch             TEXT,
    worktree           TEXT,
    created_at         REAL    NOT NULL,
    started_at         REAL,
    finished_at        REAL,
    updated_at         REAL    NOT NULL
);

CREATE INDEX tasks_claim ON tasks (priority DESC, id) WHERE status = 'queued';
CREATE INDEX tasks_status ON tasks (status);

CREATE TABLE task_deps (
    task_id    INTEGER NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    depends_on INTEGER NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    PRIMARY KEY (task_id, depends_on)
);
CREATE INDEX task_deps_reverse ON task_deps (depends_on);

CREATE TABLE task_notes (
    id         INTEGER PRIMARY KEY,
    task_id    INTEGER NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    note       TEXT    NOT NULL,
    created_at REAL    NOT NULL,
    delivered  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX task_notes_task ON task_notes (task_id);

CREATE TABLE task_questions (
    id          INTEGER PRIMARY KEY,
    task_id     INTEGER NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    question    TEXT    NOT NULL,
    asked_at    REAL    NOT NULL,
    answer      TEXT,
    answered_at REAL
);
CREATE INDEX task_questions_task ON task_questions (task_id);

CREATE TABLE workers (
    id           TEXT PRIMARY KEY,
    pid          INTEGER NOT NULL,
    host         TEXT    NOT NULL,
    started_at   REAL    NOT NULL,
    heartbeat_at REAL    NOT NULL,
    concurrency  INTEGER NOT NULL,
    stopped_at   REAL
);

CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
