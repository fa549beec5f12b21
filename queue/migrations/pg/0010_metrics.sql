-- Schema version 10 (see ../0010_metrics.sql).
ALTER TABLE tasks ADD COLUMN claimed_at DOUBLE PRECISION;
ALTER TABLE tasks ADD COLUMN queue_wait_s DOUBLE PRECISION;
ALTER TABLE tasks ADD COLUMN failure_kind TEXT;
CREATE TABLE counters (
    name  TEXT   NOT NULL,
    label TEXT   NOT NULL,
    value BIGINT NOT NULL,
    PRIMARY KEY (name, label)
);
INSERT INTO counters (name, label, value)
SELECT 'submitted', CASE WHEN agent IN ('claude-code', 'codex') THEN agent ELSE 'opencode' END,
       count(*)
  FROM tasks GROUP BY 2;
CREATE INDEX tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL;
