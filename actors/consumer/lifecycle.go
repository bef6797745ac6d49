package consumer

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
)

// Account lifecycle events (#account, #identity) can reach an index that
// never saw the account's records: a backfill that skipped it while it
// was inactive, a reactivation (which sends no record events), a move to
// another PDS, a #sync Jetstream did not forward. The processor decides,
// in the batch's transaction, which repositories such an event may leave
// incomplete (processor.Result.Rereads: users.go there); the pipeline
// queues them here, in the same transaction, for the same fenced,
// rate-limited re-read a #sync asks for (resync.go). docs/interop.md,
// "Account lifecycle".

// firstEventQueueMax bounds the re-reads of first events
// (processor.RereadFirst: a DID the index had no users row of) waiting in
// repo_resyncs at once. Jetstream sends #identity and #account events of
// every account on the network, so a burst of new accounts could
// otherwise queue far more re-reads than one per jetstream.resync_interval
// drains; past the bound they are shed (counted, logged) and a backfill
// run reads those repositories. Re-reads of accounts the index knows are
// never shed.
const firstEventQueueMax = 10_000

// resyncRank orders the queue (Resyncer.next): a #sync and a lifecycle
// event of a known account first, then first events, then the mass
// re-read after a Jetstream gap.
func resyncRank(col string) string {
	return `(CASE ` + col + ` WHEN '` + reasonGap + `' THEN 2 WHEN '` + processor.RereadFirst + `' THEN 1 ELSE 0 END)`
}

// requestRereadsSQL queues the repositories of a JSON array of [did,
// reason] pairs, due now. A repository already queued is due now too
// (keeping its attempts) and keeps the more urgent of the two reasons.
var requestRereadsSQL = `INSERT INTO repo_resyncs (did, reason, requested_at, next_at)
SELECT j.value ->> 0, j.value ->> 1, ` + database.NowMS + `, ` + database.NowMS + ` FROM json_each(?1) AS j WHERE true
ON CONFLICT (did) DO UPDATE SET
  reason = CASE WHEN ` + resyncRank("excluded.reason") + ` < ` + resyncRank("repo_resyncs.reason") + `
    THEN excluded.reason ELSE repo_resyncs.reason END,
  requested_at = excluded.requested_at, next_at = excluded.next_at`

// requestRereads queues the re-reads lifecycle events asked for, each
// repository once, in one statement. Re-reads of first events are queued
// only while fewer than limit of them wait (0: firstEventQueueMax); it
// returns how many it queued and how many it shed.
func requestRereads(ctx context.Context, tx *sql.Tx, rereads []processor.Reread, limit int) (queued, shed int, err error) {
	if len(rereads) == 0 {
		return 0, 0, nil
	}
	if limit <= 0 {
		limit = firstEventQueueMax
	}
	seen := make(map[string]bool, len(rereads))
	pairs := make([][2]string, 0, len(rereads))
	var first int
	room := -1
	for _, r := range rereads {
		if seen[r.DID] {
			continue
		}
		seen[r.DID] = true
		if r.Why == processor.RereadFirst {
			if room < 0 {
				var waiting int
				if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM repo_resyncs WHERE reason = ?1`, processor.RereadFirst).Scan(&waiting); err != nil {
					return 0, 0, fmt.Errorf("count queued re-reads of first events: %w", err)
				}
				room = max(0, limit-waiting)
			}
			if first >= room {
				shed++
				continue
			}
			first++
		}
		pairs = append(pairs, [2]string{r.DID, r.Why})
	}
	if len(pairs) == 0 {
		return 0, shed, nil
	}
	list, err := json.Marshal(pairs)
	if err != nil {
		return 0, 0, err
	}
	if _, err := tx.ExecContext(ctx, requestRereadsSQL, string(list)); err != nil {
		return 0, 0, fmt.Errorf("queue %d re-reads: %w", len(pairs), err)
	}
	return len(pairs), shed, nil
}

// Why a repository is noted in repo_incomplete (reason).
const (
	incompleteResync = "resync-inactive"
)

// noteIncompleteSQL notes a repository this index may hold incompletely
// (repo_incomplete); a note already there keeps its reason.
const noteIncompleteSQL = `INSERT INTO repo_incomplete (did, reason, noted_at) VALUES (?1, ?2, ` + database.NowMS + `)
ON CONFLICT (did) DO NOTHING`

// refusedStatus is the account status a PDS refusal (an errRepoInactive)
// names: RepoDeactivated, RepoTakendown, RepoSuspended; "" when it names
// none (RepoNotFound: deleted, or moved away).
func refusedStatus(err error) string {
	var xe *refusal
	if !errors.As(err, &xe) {
		return ""
	}
	switch xe.code {
	case "RepoDeactivated":
		return "deactivated"
	case "RepoTakendown":
		return "takendown"
	case "RepoSuspended":
		return "suspended"
	}
	return ""
}

// refusal is an XRPC error a PDS answered with.
type refusal struct {
	code, message string
}

func (r *refusal) Error() string { return r.code + ": " + r.message }

// userState is the users row of a DID as a re-read found it before asking
// the PDS: whether there is one, whether it is active, and account_us.
type userState struct {
	found, active bool
	accountUS     int64
}

// readUser reads did's users row (userState).
func (r *Resyncer) readUser(ctx context.Context, did string) (userState, error) {
	var u userState
	err := r.DB.QueryRowContext(ctx, `SELECT active, account_us FROM users WHERE did = ?1`, did).Scan(&u.active, &u.accountUS)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return userState{}, nil
	case err != nil:
		return userState{}, fmt.Errorf("read users row of %s: %w", did, err)
	}
	u.found = true
	return u, nil
}

// statusEvents is the inactive status a PDS refusal named, as an #account
// event for the processor, when the users row read before the PDS was
// asked (before) says active: stamped one microsecond after that row's
// account_us, so it applies only if no #account event was applied since
// (account_us only grows): an event applied meanwhile is newer than what
// the PDS said, and wins. A DID without a users row gets none.
//
// A repository served does not make an inactive row active: the relay
// takes accounts down by #account events (status takendown) while their
// PDS may still serve them, so only an #account event makes an account
// visible again.
func statusEvents(did string, before userState, status string) []jetstream.Event {
	if !before.found || !before.active || status == "" {
		return nil
	}
	active := false
	return []jetstream.Event{{DID: did, TimeUS: before.accountUS + 1, Kind: jetstream.KindAccount,
		Account: &jetstream.Account{DID: did, Active: &active, Status: status}}}
}

// describeCollections asks the PDS which collections did has records in
// (com.atproto.repo.describeRepo), so a re-read lists only those: a
// repository with no io.atcr.* record (the first event of an account
// new to this index, as a rule) costs one request, not one per
// collection. nil when the PDS does not answer it (an older or other
// PDS, a DID it cannot resolve): every collection is listed then. A
// refusal as inactive is returned.
func (r *Resyncer) describeCollections(ctx context.Context, pds, did string) (map[string]bool, error) {
	var out struct {
		Collections []string `json:"collections"`
	}
	err := r.get(ctx, pds, "com.atproto.repo.describeRepo", url.Values{"repo": {did}}, &out)
	switch {
	case errors.Is(err, errRepoInactive):
		return nil, err
	case err != nil:
		if ctx.Err() != nil {
			return nil, err
		}
		r.Log.Debug().Str("did", did).Str("error", bounded(err.Error())).Msg("describeRepo unanswered; listing every collection")
		return nil, nil
	}
	has := make(map[string]bool, len(out.Collections))
	for _, c := range out.Collections {
		if strings.HasPrefix(c, "io.atcr.") {
			has[c] = true
		}
	}
	return has, nil
}

// heldCollections are the collections of resyncCollections the database
// holds rows of for did: a re-read lists them whatever describeRepo says,
// so what it removes is always decided by listRecords.
func (r *Resyncer) heldCollections(ctx context.Context, did string) (map[string]bool, error) {
	held := map[string]bool{}
	for _, col := range resyncCollections {
		if col.rkeys == "" {
			continue
		}
		have, err := database.Column(ctx, r.DB, col.rkeys, did)
		if err != nil {
			return nil, fmt.Errorf("list stored %s of %s: %w", col.nsid, did, err)
		}
		if len(have) > 0 {
			held[col.nsid] = true
		}
	}
	return held, nil
}
