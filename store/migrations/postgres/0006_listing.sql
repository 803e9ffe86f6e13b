-- sharedos store (PostgreSQL), schema version 6 (docs/STORE.md, "Listing").
-- Keyset pages of a scope's sessions and a session's runs in creation
-- order: times are RFC 3339 text whose fraction has no fixed width, so
-- the order is the time in milliseconds since the Unix epoch. Every time
-- sharedos stores carries its offset, so the conversion does not depend
-- on the session's TimeZone: the function is immutable for them, and an
-- index may hold it. Text that is no RFC 3339 time gives NULL (never
-- listed), as SQLite's unixepoch does, instead of failing the migration.
CREATE OR REPLACE FUNCTION sharedos_millis(at TEXT) RETURNS BIGINT
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT CASE
        WHEN at ~* '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$'
        THEN (EXTRACT(EPOCH FROM at::timestamptz) * 1000)::bigint
    END $$;
CREATE INDEX IF NOT EXISTS sessions_listing ON sessions (scope, sharedos_millis(created_at), id);
CREATE INDEX IF NOT EXISTS runs_listing ON runs (session_id, sharedos_millis(admitted_at), id);
