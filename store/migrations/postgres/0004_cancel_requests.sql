-- sharedos store (PostgreSQL), schema version 4.
-- A cancel asked of a run in flight, by any host: the host that runs it
-- looks for these (woken by a notification where the store has them) and
-- cancels its turn (docs/SERVE.md, "Control across hosts").
ALTER TABLE runs ADD COLUMN cancel_requested_at TEXT;
