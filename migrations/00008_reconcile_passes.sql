-- The reconciler's last passes, so the operators' console (and a query by
-- hand) can tell when the last pass ran, how it ended and what drift it
-- found, without reaching the reconciler's own /metrics. The reconciler
-- writes one row per pass it ran (not for a dry run) and keeps the last
-- hundred.

-- +goose Up
CREATE TABLE reconcile_passes (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    result      text        NOT NULL CHECK (result IN ('ok', 'partial', 'failed')),
    -- The pass's report: the JSON line `reconciler --once` prints.
    report      jsonb       NOT NULL,
    -- Why a failed pass failed.
    error       text
);

-- +goose Down
DROP TABLE reconcile_passes;
