-- Schema version 4: decisions the agent waits for (its own questions, permission requests,
-- budget stops), permission rules that ask, and budgets.
-- The pending decision as JSON (queue::Ask); kept from the question until the claim that
-- delivers its answer.
ALTER TABLE tasks ADD COLUMN ask TEXT;
-- The worker whose OpenCode server holds the agent blocked on that decision: while it lives,
-- only it may resume the task (it answers the blocked request instead of prompting again).
ALTER TABLE tasks ADD COLUMN parked_worker TEXT;
-- JSON array of PERMISSION[:PATTERN] rules that ask instead of allowing.
ALTER TABLE tasks ADD COLUMN ask_rules TEXT;
ALTER TABLE tasks ADD COLUMN max_cost_usd REAL;
ALTER TABLE tasks ADD COLUMN max_tokens INTEGER;
-- A batch's shared budget.
CREATE TABLE budgets (
    id           INTEGER PRIMARY KEY,
    max_cost_usd REAL,
    max_tokens   INTEGER,
    created_at   REAL NOT NULL
);
ALTER TABLE tasks ADD COLUMN budget_group INTEGER REFERENCES budgets (id);
ALTER TABLE task_questions ADD COLUMN ask TEXT;
ALTER TABLE task_questions ADD COLUMN answered_by TEXT;
