-- sharedos store (SQLite), schema version 6 (docs/STORE.md, "Listing").
-- Keyset pages of a scope's sessions and a session's runs in creation
-- order: times are RFC 3339 text whose fraction has no fixed width, so
-- the order is the time in milliseconds since the Unix epoch, the same
-- expression the listing queries use.
CREATE INDEX IF NOT EXISTS sessions_listing
    ON sessions (scope, CAST(ROUND(unixepoch(created_at, 'subsec') * 1000) AS INTEGER), id);
CREATE INDEX IF NOT EXISTS runs_listing
    ON runs (session_id, CAST(ROUND(unixepoch(admitted_at, 'subsec') * 1000) AS INTEGER), id);
