-- Named leases (SPEC §4). Exact shape: tests and operators read it.
-- Timestamps are Unix milliseconds from the database's clock. Nothing ever
-- deletes a row: a release expires it in place so the fence survives.
CREATE TABLE leases (
  name        TEXT    PRIMARY KEY,
  holder      TEXT    NOT NULL,
  fence       INTEGER NOT NULL,
  acquired_at INTEGER NOT NULL,
  renewed_at  INTEGER NOT NULL,
  expires_at  INTEGER NOT NULL
);

-- Instances contending for a lease, with the URL of their admin endpoint, so
-- a releasing holder can nudge them into an immediate acquire attempt.
-- Advisory only: correctness never depends on it.
CREATE TABLE lease_contenders (
  name      TEXT    NOT NULL,
  instance  TEXT    NOT NULL,
  nudge_url TEXT    NOT NULL,
  seen_at   INTEGER NOT NULL,
  PRIMARY KEY (name, instance)
);
