package processor

import (
	"fmt"

	"github.com/atcr-io/appview/internal/database"
)

// readUsers marks, among dids, those whose users row exists, so
// ensureUser writes nothing for them (the processor never deletes a users
// row, and the transaction holds the write lock).
func (a *applier) readUsers(dids []string) error {
	return database.Chunks(len(dids), 1, 0, func(lo, hi int) error {
		args := make([]any, hi-lo)
		for i, d := range dids[lo:hi] {
			args[i] = d
		}
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
	// The handle PrepareBatch verified for a new user, if any, and the PDS
	// its DID document named.
	_, err := a.exec(`INSERT INTO users (did, handle, pds, identity_us, account_us, updated_at) VALUES (?1, ?4, ?5, ?2, ?2, ?3)
ON CONFLICT (did) DO NOTHING`, o.did, o.ev.TimeUS, o.ev.TimeUS/1000, a.handles[o.did], a.endpoints[o.did])
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
//
// The first event of a DID with no users row is kept: a row is created
// (firstEvent), so later events have something to update, and the
// repository is re-read (RereadFirst). A later event asks for a re-read
// when its DID document names another PDS than the row had (the
// repository moved: what the new PDS holds may differ) or the repository
// is one this index may hold incompletely (repo_incomplete).
func (a *applier) identity(o *op) (bool, error) {
	var (
		stored string
		us     int64
	)
	found, err := a.read(`SELECT `+database.Text("pds")+`, identity_us FROM users WHERE did = ?1`, []any{o.did}, &stored, &us)
	switch {
	case err != nil:
		return false, fmt.Errorf("identity: %w", err)
	case !found:
		return a.firstEvent(o, true, "")
	case us >= o.ev.TimeUS:
		return false, nil // a newer identity event was applied
	}
	var handle any
	if h, ok := a.handles[o.did]; ok {
		handle = h
	}
	pds := a.endpoints[o.did]
	n, err := a.exec(`UPDATE users SET handle = COALESCE(?1, handle), identity_us = ?2, updated_at = ?3,
  pds = CASE WHEN ?5 <> '' THEN ?5 ELSE pds END
WHERE did = ?4 AND identity_us < ?2`, handle, o.ev.TimeUS, o.ev.TimeUS/1000, o.did, pds)
	if err != nil {
		return false, fmt.Errorf("identity: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	moved := pds != "" && stored != "" && pds != stored
	if !moved {
		if moved, err = a.incomplete(o.did); err != nil {
			return false, fmt.Errorf("identity: %w", err)
		}
	}
	if moved {
		a.pendingRereads = append(a.pendingRereads, Reread{DID: o.did, Why: RereadIdentity})
	}
	return true, nil
}

// account applies an #account event. When it changes whether the
// account is active, the repositories it starred are touched: their
// star_count counts only active accounts' stars (StarCountSQL).
//
// The first event of a DID with no users row is kept (firstEvent: a row
// with the event's status), and re-read when it says the account is
// active. A later event that makes the account active asks for a re-read
// when the index may hold the repository incompletely: the row was
// inactive (an index built by a backfill that ran meanwhile never saw its
// records; a reactivation sends no record events), or repo_incomplete
// names it.
func (a *applier) account(o *op) (bool, error) {
	active := *o.account.Active // decode refused an event without it
	status := o.account.Status
	if active {
		status = ""
	}
	var (
		was bool
		us  int64
	)
	found, err := a.read(`SELECT active, account_us FROM users WHERE did = ?1`, []any{o.did}, &was, &us)
	switch {
	case err != nil:
		return false, fmt.Errorf("account: %w", err)
	case !found:
		return a.firstEvent(o, active, status)
	case us >= o.ev.TimeUS:
		return false, nil // a newer account event was applied
	}
	n, err := a.exec(`UPDATE users SET active = ?1, status = ?2, account_us = ?3, updated_at = MAX(updated_at, ?4)
WHERE did = ?5 AND account_us < ?3`, active, status, o.ev.TimeUS, o.ev.TimeUS/1000, o.did)
	if err != nil {
		return false, fmt.Errorf("account: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	if active {
		reread := !was
		if !reread {
			if reread, err = a.incomplete(o.did); err != nil {
				return false, fmt.Errorf("account: %w", err)
			}
		}
		if reread {
			a.pendingRereads = append(a.pendingRereads, Reread{DID: o.did, Why: RereadAccount})
		}
	}
	if was != active {
		if err := a.touchStarred(o.did); err != nil {
			return false, fmt.Errorf("account: %w", err)
		}
	}
	return true, nil
}

// firstEvent creates the users row of a DID whose first event (#identity
// or #account) this is, with the handle and PDS PrepareBatch verified and,
// for an #account event, its status (an #identity event says nothing of
// it: active until an #account event or a re-read says otherwise).
// The event's own order column (identity_us or account_us) starts at its
// time, the other at 0: the first pass keeps every event from now on, so
// an event of the other kind stamped a little earlier (the live tail is
// not in time_us order) still applies. It asks for a re-read
// (RereadFirst) unless the event says the account is inactive: its PDS
// would not serve the repository.
func (a *applier) firstEvent(o *op, active bool, status string) (bool, error) {
	identityUS, accountUS := o.ev.TimeUS, int64(0)
	if o.account != nil {
		identityUS, accountUS = 0, o.ev.TimeUS
	}
	n, err := a.exec(`INSERT INTO users (did, handle, pds, active, status, identity_us, account_us, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (did) DO NOTHING`,
		o.did, a.handles[o.did], a.endpoints[o.did], active, status, identityUS, accountUS, o.ev.TimeUS/1000)
	if err != nil {
		return false, fmt.Errorf("first event of %s: %w", o.did, err)
	}
	a.setUser(o.did)
	if n > 0 && active {
		a.pendingRereads = append(a.pendingRereads, Reread{DID: o.did, Why: RereadFirst})
	}
	return n > 0, nil
}

// incomplete reports whether repo_incomplete names did: a backfill
// skipped or failed its repository, or a re-read was refused (a primary
// key lookup).
func (a *applier) incomplete(did string) (bool, error) {
	found, err := a.exists(`SELECT 1 FROM repo_incomplete WHERE did = ?1`, did)
	if err != nil {
		return false, fmt.Errorf("read repo_incomplete: %w", err)
	}
	return found, nil
}

// touchStarred marks the repositories did starred as touched: their
// star_count changes when did's account becomes active or inactive.
func (a *applier) touchStarred(did string) error {
	rows, err := a.tx.QueryContext(a.ctx, `SELECT DISTINCT `+database.Text("owner_did")+`, `+database.Text("repository")+`
FROM stars WHERE did = ?1`, did)
	if err != nil {
		return fmt.Errorf("stars of %s: %w", did, err)
	}
	defer rows.Close()
	for rows.Next() {
		var k repoKey
		if err := rows.Scan(&k.did, &k.repository); err != nil {
			return fmt.Errorf("stars of %s: %w", did, err)
		}
		a.pendingTouched = append(a.pendingTouched, k)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("stars of %s: %w", did, err)
	}
	return nil
}
