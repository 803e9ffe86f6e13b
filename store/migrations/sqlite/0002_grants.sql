-- sharedos store, schema version 2.
-- Grants held in the store: the kernel's grant source under `sharedos serve`.
-- `grant_json` is the grant as the kernel reads it; `revoked` overrides its
-- `revoked` field (a revocation is a column update, never a rewrite).
-- `origin` is `configuration` (imported from [kernel].grants at start) or
-- `operator` (`sharedos grants add`). A revoked id is never live again.
CREATE TABLE grants (
    id           TEXT PRIMARY KEY,
    namespace_id TEXT NOT NULL,
    subject      TEXT NOT NULL,
    grant_json   TEXT NOT NULL,
    origin       TEXT NOT NULL,
    revoked      INTEGER NOT NULL DEFAULT 0,
    added_at     TEXT NOT NULL,
    revoked_at   TEXT
);
CREATE INDEX grants_subject ON grants (namespace_id, subject);
