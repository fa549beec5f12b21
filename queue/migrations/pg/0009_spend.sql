-- Schema version 9 (see ../0009_spend.sql).
ALTER TABLE tasks ADD COLUMN cost_usd DOUBLE PRECISION;
ALTER TABLE tasks ADD COLUMN tokens BIGINT;
UPDATE tasks
   SET cost_usd = (result::jsonb #>> '{usage,cost_usd}')::float8,
       tokens = coalesce((result::jsonb #>> '{usage,input_tokens}')::bigint, 0)
              + coalesce((result::jsonb #>> '{usage,output_tokens}')::bigint, 0)
 WHERE result IS NOT NULL;
