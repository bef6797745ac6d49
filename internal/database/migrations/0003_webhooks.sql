-- Webhooks and their delivery outbox (SPEC §8, §9). Times are Unix
-- milliseconds on the database's clock.

-- One subscription: deliver triggers about did's repositories to url.
-- triggers is a JSON array of trigger names (a comma list is also read);
-- "push" is the only trigger so far. secret signs bodies (HMAC-SHA256);
-- empty means unsigned.
CREATE TABLE webhooks (
  id         INTEGER PRIMARY KEY,
  did        TEXT    NOT NULL,
  url        TEXT    NOT NULL,
  secret     TEXT    NOT NULL DEFAULT '',
  triggers   TEXT    NOT NULL DEFAULT '["push"]',
  created_at INTEGER NOT NULL
);
CREATE INDEX webhooks_by_did ON webhooks (did);

-- The transactional outbox: a row is written in the same fenced transaction
-- as the record that triggered it, and UNIQUE(webhook_id, event_key) makes a
-- replayed or rewound event a no-op. The dispatcher claims a row (attempts+1,
-- next_attempt_at pushed past the attempt timeout, fence of the claimant)
-- before each send and records the outcome afterwards, both fenced.
--
-- trigger_data is the trigger as enqueued (JSON); payload is the request body,
-- built once on the first attempt and sent byte for byte on every retry.
-- next_attempt_at is when the row becomes due; for a row never attempted it
-- is the enqueue time and the first delay of webhooks.retry_schedule is added
-- when due rows are selected. updated_at is what the cleanup sweep prunes
-- finished rows by.
CREATE TABLE webhook_deliveries (
  id               INTEGER PRIMARY KEY,
  webhook_id       INTEGER NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
  event_key        TEXT    NOT NULL,
  trigger_name     TEXT    NOT NULL,
  trigger_data     TEXT    NOT NULL,
  status           TEXT    NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'delivered', 'failed')),
  attempts         INTEGER NOT NULL DEFAULT 0,
  payload          TEXT,
  next_attempt_at  INTEGER NOT NULL,
  last_error       TEXT    NOT NULL DEFAULT '',
  last_status_code INTEGER NOT NULL DEFAULT 0,
  fence            INTEGER NOT NULL DEFAULT 0,
  created_at       INTEGER NOT NULL,
  updated_at       INTEGER NOT NULL,
  UNIQUE (webhook_id, event_key)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_attempt_at);
CREATE INDEX webhook_deliveries_by_updated ON webhook_deliveries (status, updated_at);
