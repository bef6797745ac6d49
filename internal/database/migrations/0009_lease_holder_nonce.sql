-- A holder's identity is its instance_id plus a nonce drawn at every process
-- start: two processes an operator configured with the same instance_id are
-- still told apart, so one never takes the other's grant for its own (and
-- releases it). Rows written before this column existed, or by an older
-- version, carry '' and are never any process's own.
ALTER TABLE leases ADD COLUMN holder_nonce TEXT NOT NULL DEFAULT '';

-- The contender's process nonce (to warn about a duplicate instance_id) and
-- its worker's health as last reported (1 healthy, 0 unhealthy): a holder
-- whose worker is unhealthy yields only to a contender recorded healthy.
ALTER TABLE lease_contenders ADD COLUMN nonce TEXT NOT NULL DEFAULT '';
ALTER TABLE lease_contenders ADD COLUMN healthy INTEGER NOT NULL DEFAULT 1;
