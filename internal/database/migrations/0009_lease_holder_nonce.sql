-- A holder's identity is its instance_id plus a nonce drawn at every process
-- start: two processes an operator configured with the same instance_id are
-- still told apart, so one never takes the other's grant for its own (and
-- releases it). The leases table keeps its exact SPEC §4 shape; the nonce of
-- each name's current grant is kept beside it, written in the acquire's own
-- transaction. A grant with no row here (made by an older version) is no
-- process's own.
CREATE TABLE lease_holders (
  name  TEXT    PRIMARY KEY,
  fence INTEGER NOT NULL,
  nonce TEXT    NOT NULL
);

-- The contender's process nonce (to warn about a duplicate instance_id) and
-- its worker's health as last reported (1 healthy, 0 unhealthy): a holder
-- whose worker is unhealthy yields only to a contender recorded healthy.
ALTER TABLE lease_contenders ADD COLUMN nonce TEXT NOT NULL DEFAULT '';
ALTER TABLE lease_contenders ADD COLUMN healthy INTEGER NOT NULL DEFAULT 1;
