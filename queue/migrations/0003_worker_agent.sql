-- Schema version 3: which agent each worker drives ("opencode run", "opencode serve"), shown by
-- `list_workers` and `queue_status`. NULL for workers registered by an older binary.
ALTER TABLE workers ADD COLUMN agent TEXT;
