package processor

import (
	"database/sql"
	"errors"
	"fmt"

	"github.com/atcr-io/appview/internal/database"
)

// readUsers marks, among dids, those whose users row exists, so
// ensureUser writes nothing for them (the processor never deletes a users
// row, and the transaction holds the write lock).
func (a *applier) readUsers(dids []string) error {
	return database.Chunks(len(dids), 1, 0, func(lo, hi int) error {
		args := make([]any, hi-lo, database.Bucket(hi-lo))
		for i, d := range dids[lo:hi] {
			args[i] = d
		}
		args = database.Pad(args, 1)
		rows, err := a.tx.QueryContext(a.ctx, `SELECT `+database.Text("did")+` FROM users WHERE did IN (`+
			database.InList(len(args))+`)`, args...)
		if err != nil {
			return fmt.Errorf("read users: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var did string
			if err := rows.Scan(&did); err != nil {
				return fmt.Errorf("read users: %w", err)
			}
			a.setUser(did)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read users: %w", err)
		}
		return nil
	})
}

// ensureUser creates the users row of a DID that has a user-repo record.
// identity_us and account_us start at this event's time: an older identity
// or account event, replayed later, must not change the row when the first
// pass (which had no row to update) left it alone.
func (a *applier) ensureUser(o *op) error {
	if a.users[o.did] {
		return a.fillHandle(o.did)
	}
	// The handle PrepareBatch verified for a new user, if any.
	_, err := a.exec(`INSERT INTO users (did, handle, identity_us, account_us, updated_at) VALUES (?1, ?4, ?2, ?2, ?3)
ON CONFLICT (did) DO NOTHING`, o.did, o.ev.TimeUS, o.ev.TimeUS/1000, a.handles[o.did])
	if err != nil {
		return fmt.Errorf("ensure user: %w", err)
	}
	a.setUser(o.did)
	return a.fillHandle(o.did)
}

// fillHandle sets the handle PrepareBatch verified for did on a users row
// that has none (its first lookup failed), once per batch. A row with a
// handle is left to #identity events, which alone change a set handle.
func (a *applier) fillHandle(did string) error {
	h := a.handles[did]
	if h == "" || a.filled[did] {
		return nil
	}
	if _, err := a.exec(`UPDATE users SET handle = ?1 WHERE did = ?2 AND (handle IS NULL OR handle = '')`, h, did); err != nil {
		return fmt.Errorf("fill user handle: %w", err)
	}
	if a.filled == nil {
		a.filled = map[string]bool{}
	}
	a.filled[did] = true
	return nil
}

// identity applies an #identity event. The handle is the one PrepareBatch
// verified from the DID document ("" clears a handle that no longer
// verifies); without one (no resolver, or the lookup failed) the row
// keeps the handle it has. The event's own handle is never stored: the
// firehose says it "might have been validated or passed-through from an
// upstream source" (com.atproto.sync.subscribeRepos#identity), and the
// owner of a did:web whose document cannot be fetched could otherwise
// name itself with anyone's handle.
func (a *applier) identity(o *op) (bool, error) {
	var handle any
	if h, ok := a.handles[o.did]; ok {
		handle = h
	}
	n, err := a.exec(`UPDATE users SET handle = COALESCE(?1, handle), identity_us = ?2, updated_at = ?3
WHERE did = ?4 AND identity_us < ?2`, handle, o.ev.TimeUS, o.ev.TimeUS/1000, o.did)
	if err != nil {
		return false, fmt.Errorf("identity: %w", err)
	}
	return n > 0, nil
}

// account applies an #account event. When it changes whether the
// account is active, the repositories it starred are touched: their
// star_count counts only active accounts' stars (StarCountSQL).
func (a *applier) account(o *op) (bool, error) {
	active := *o.account.Active // decode refused an event without it
	status := o.account.Status
	if active {
		status = ""
	}
	var was bool
	err := a.tx.QueryRowContext(a.ctx, `SELECT active FROM users WHERE did = ?1 AND account_us < ?2`, o.did, o.ev.TimeUS).Scan(&was)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil // no row, or a newer account event applied
	case err != nil:
		return false, fmt.Errorf("account: %w", err)
	}
	n, err := a.exec(`UPDATE users SET active = ?1, status = ?2, account_us = ?3, updated_at = ?4
WHERE did = ?5 AND account_us < ?3`, active, status, o.ev.TimeUS, o.ev.TimeUS/1000, o.did)
	if err != nil {
		return false, fmt.Errorf("account: %w", err)
	}
	if n > 0 && was != active {
		rows, err := a.tx.QueryContext(a.ctx, `SELECT DISTINCT `+database.Text("owner_did")+`, `+database.Text("repository")+`
FROM stars WHERE did = ?1`, o.did)
		if err != nil {
			return false, fmt.Errorf("account: stars of %s: %w", o.did, err)
		}
		defer rows.Close()
		for rows.Next() {
			var k repoKey
			if err := rows.Scan(&k.did, &k.repository); err != nil {
				return false, fmt.Errorf("account: stars of %s: %w", o.did, err)
			}
			a.pendingTouched = append(a.pendingTouched, k)
		}
		if err := rows.Err(); err != nil {
			return false, fmt.Errorf("account: stars of %s: %w", o.did, err)
		}
	}
	return n > 0, nil
}
