-- An instance running with leases off (leases.enabled false: every worker
-- unfenced, on the understanding that it is alone) records itself here
-- while it runs (internal/leasestore: MarkUnleased), one row per process
-- start, refreshed every every_ms and deleted at its stop, so that an
-- instance started beside it can see it (cmd/appview: besideUnleased)
-- and it can see one started beside it at the same moment.
CREATE TABLE unleased_instances (
  instance   TEXT    NOT NULL,
  nonce      TEXT    NOT NULL,
  started_at INTEGER NOT NULL, -- Unix ms, database clock
  seen_at    INTEGER NOT NULL, -- Unix ms, database clock: the last refresh
  every_ms   INTEGER NOT NULL, -- its refresh interval (its leases.renew_interval)
  PRIMARY KEY (instance, nonce)
);
