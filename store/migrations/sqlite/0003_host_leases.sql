-- sharedos store, schema version 3.
-- Host leases (docs/STORE.md, "Recovery across machines"): one row per host
-- id. `expires_at` is in milliseconds since the Unix epoch; `epoch` grows by
-- one each time a process takes the lease (at its start) or another host
-- takes over the runs of an expired lease. Every run write a leased host
-- makes checks, in its transaction, that the epoch it took is still the
-- row's: a host whose lease was taken over writes nothing more.
CREATE TABLE host_leases (
    host_id    TEXT PRIMARY KEY,
    epoch      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
-- Hosts with runs in flight before leases existed hold an expired lease:
-- their replacement (same host id) or any live host reconciles them.
INSERT INTO host_leases (host_id, epoch, expires_at)
    SELECT DISTINCT host_id, 0, 0 FROM runs WHERE state = 'in_flight';
