-- A run's model usage, kept by the database: each step_completed event that carries a
-- "usage" object adds it to its run in the same transaction, so the totals always equal the
-- journal's sum, however the writer died.
ALTER TABLE runs ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cost_usd REAL NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN model_calls INTEGER NOT NULL DEFAULT 0;

CREATE TRIGGER journal_events_usage AFTER INSERT ON journal_events
WHEN NEW.kind = 'step_completed' AND json_type(NEW.data, '$.usage') = 'object'
BEGIN
    UPDATE runs SET
        input_tokens = input_tokens + COALESCE(json_extract(NEW.data, '$.usage.inputTokens'), 0),
        output_tokens = output_tokens + COALESCE(json_extract(NEW.data, '$.usage.outputTokens'), 0),
        cost_usd = cost_usd + COALESCE(json_extract(NEW.data, '$.usage.costUsd'), 0),
        model_calls = model_calls + COALESCE(json_extract(NEW.data, '$.usage.modelCalls'), 0)
    WHERE id = NEW.run_id;
END;
