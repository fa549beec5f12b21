-- Schema version 8 (see ../0008_worker_agents.sql).
ALTER TABLE workers ADD COLUMN agents TEXT;
