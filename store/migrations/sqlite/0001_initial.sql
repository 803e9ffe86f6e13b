-- sharedos store, schema version 1.
-- Usage counters of bounded grants (maxUses), one row per grant.
CREATE TABLE usage_counters (
    grant_id TEXT PRIMARY KEY,
    used     INTEGER NOT NULL
);

-- The audit trail: one row per record, committed before append returns.
CREATE TABLE audit_records (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    trace_id     TEXT NOT NULL,
    kind         TEXT NOT NULL,
    outcome      TEXT NOT NULL,
    operation_id TEXT,
    record       TEXT NOT NULL
);
CREATE INDEX audit_records_trace ON audit_records (trace_id, seq);

-- Sessions: an agent bound to a runtime under a trusted scope.
CREATE TABLE sessions (
    id         TEXT PRIMARY KEY,
    agent_id   TEXT NOT NULL,
    runtime_id TEXT NOT NULL,
    scope      TEXT NOT NULL,
    binding    TEXT NOT NULL,
    open       INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    closed_at  TEXT
);

-- Runs: admitted durably before dispatch; (session, requestId) unique.
CREATE TABLE runs (
    id              TEXT PRIMARY KEY,
    session_id      TEXT NOT NULL REFERENCES sessions (id),
    request_id      TEXT NOT NULL,
    payload_digest  TEXT NOT NULL,
    input           TEXT NOT NULL,
    state           TEXT NOT NULL,
    host_id         TEXT NOT NULL,
    result          TEXT,
    recovery        TEXT,
    dropped_through INTEGER,
    admitted_at     TEXT NOT NULL,
    ended_at        TEXT,
    UNIQUE (session_id, request_id)
);
CREATE INDEX runs_in_flight ON runs (host_id, state);

-- The event journal: each event of a run under its sequence.
CREATE TABLE run_events (
    run_id   TEXT NOT NULL REFERENCES runs (id),
    sequence INTEGER NOT NULL,
    event    TEXT NOT NULL,
    PRIMARY KEY (run_id, sequence)
) WITHOUT ROWID;
