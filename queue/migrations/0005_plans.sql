-- Schema version 5: plans that compose.
-- The branch the task was submitted from (what `merge_task` merges into by default).
ALTER TABLE tasks ADD COLUMN base_ref TEXT;
-- The commit the task's branch started from: its base, or its dependencies' work (stacked).
ALTER TABLE tasks ADD COLUMN started_from TEXT;
-- JSON array of the dependency ids whose work it started from.
ALTER TABLE tasks ADD COLUMN stacked_on TEXT;
-- Where `merge_task` brought the task's work, and the commit that did it.
ALTER TABLE tasks ADD COLUMN merged_into TEXT;
ALTER TABLE tasks ADD COLUMN merge_commit TEXT;
-- A follow-up's parent: the task whose session it resumes and whose commit it starts from.
ALTER TABLE tasks ADD COLUMN parent INTEGER REFERENCES tasks (id) ON DELETE SET NULL;
