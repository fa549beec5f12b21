-- Schema version 6: queues shared by several hosts.
-- The git remote a worker on another host fetches the task's base from and pushes its branch to.
ALTER TABLE tasks ADD COLUMN remote TEXT;
