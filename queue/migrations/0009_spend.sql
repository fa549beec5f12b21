-- Schema version 9: a task's spend in columns of its own, written with its result, so the
-- queue's sums (today's spend, a batch's budget) read no JSON. `cost_usd` is NULL where the cost
-- is unknown (an agent that reports none); `tokens` is input plus output tokens.
ALTER TABLE tasks ADD COLUMN cost_usd REAL;
ALTER TABLE tasks ADD COLUMN tokens INTEGER;
UPDATE tasks
   SET cost_usd = json_extract(result, '$.usage.cost_usd'),
       tokens = coalesce(json_extract(result, '$.usage.input_tokens'), 0)
              + coalesce(json_extract(result, '$.usage.output_tokens'), 0)
 WHERE result IS NOT NULL AND json_valid(result);
