-- Schema version 7: agents left running by a worker that died, kept for its host.
-- A lease that expired is reaped by whichever worker looks first, maybe on another host of a
-- shared queue, which cannot kill a process there; the row waits for a worker on `host` (the
-- dead one restarted, say), which kills the process group if it is still that process.
CREATE TABLE orphans (
    id       INTEGER PRIMARY KEY,
    host     TEXT    NOT NULL,
    pid      INTEGER NOT NULL,
    started  TEXT,
    task_id  INTEGER,
    found_at REAL    NOT NULL
);
CREATE INDEX orphans_host ON orphans (host);
