-- sharedos store (SQLite), schema version 5.
-- Tenant credentials of `sharedos serve` (`sharedos tokens add | list | revoke`).
-- A token fixes the scope part a tenant cannot choose: `namespace_id` and
-- `authority_json` (the Address JSON). Only the SHA-256 of the secret is kept
-- (lowercase hex); the secret itself is shown once, when the token is added.
-- A revoked token stays, with `revoked_at`, and is never live again.
CREATE TABLE tokens (
    id             TEXT PRIMARY KEY,
    namespace_id   TEXT NOT NULL,
    authority_json TEXT NOT NULL,
    label          TEXT NOT NULL,
    secret_sha256  TEXT NOT NULL UNIQUE,
    created_at     TEXT NOT NULL,
    revoked_at     TEXT
);
