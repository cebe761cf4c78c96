-- A run's model usage, kept by the database: each step_completed event that carries a
-- "usage" object adds it to its run in the same transaction, so the totals always equal the
-- journal's sum, however the writer died.
ALTER TABLE runs ADD COLUMN input_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN output_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cost_usd double precision NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN model_calls integer NOT NULL DEFAULT 0;

CREATE FUNCTION lantern_add_run_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs SET
        input_tokens = input_tokens + COALESCE((NEW.data #>> '{usage,inputTokens}')::bigint, 0),
        output_tokens = output_tokens + COALESCE((NEW.data #>> '{usage,outputTokens}')::bigint, 0),
        cost_usd = cost_usd + COALESCE((NEW.data #>> '{usage,costUsd}')::double precision, 0),
        model_calls = model_calls + COALESCE((NEW.data #>> '{usage,modelCalls}')::integer, 0)
    WHERE id = NEW.run_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER journal_events_usage AFTER INSERT ON journal_events FOR EACH ROW
    WHEN (NEW.kind = 'step_completed' AND NEW.data ? 'usage')
    EXECUTE FUNCTION lantern_add_run_usage();
