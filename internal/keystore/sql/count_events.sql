-- count_events: events waiting for delivery, and parked ones.
SELECT count(*) FILTER (WHERE parked_at IS NULL), count(*) FILTER (WHERE parked_at IS NOT NULL)
FROM outbox
