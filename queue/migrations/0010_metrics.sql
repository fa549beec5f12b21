-- Schema version 10: what metrics and the stats view read from the queue. Each claim records
-- when it took the task and how long the task had been ready for it; a failed attempt records
-- its kind beside the error text. `counters` keeps what the queue counts for ever, whatever
-- `clear_finished` removes later: tasks submitted, by agent (`opencode`, `claude-code`, `codex`).
ALTER TABLE tasks ADD COLUMN claimed_at REAL;
ALTER TABLE tasks ADD COLUMN queue_wait_s REAL;
ALTER TABLE tasks ADD COLUMN failure_kind TEXT;
CREATE TABLE counters (
    name  TEXT    NOT NULL,
    label TEXT    NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (name, label)
);
INSERT INTO counters (name, label, value)
SELECT 'submitted', CASE WHEN agent IN ('claude-code', 'codex') THEN agent ELSE 'opencode' END,
       count(*)
  FROM tasks GROUP BY 2;
CREATE INDEX tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL;
