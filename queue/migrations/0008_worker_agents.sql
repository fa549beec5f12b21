-- Schema version 8: the agents each worker can run, as ',opencode,claude-code,codex,' (the
-- CLIs found on its host). A task for an agent a live worker can run is left to such a worker;
-- NULL is a worker from before there were several agents: it runs OpenCode only.
ALTER TABLE workers ADD COLUMN agents TEXT;
