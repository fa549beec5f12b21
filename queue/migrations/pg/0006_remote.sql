-- Schema version 6 (see ../0006_remote.sql).
ALTER TABLE tasks ADD COLUMN remote TEXT;
