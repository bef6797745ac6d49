package webhooks

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/atcr-io/appview/internal/database"
)

// Push is one "push" trigger: a manifest newly stored (the first insert of
// its (did, repository, digest)).
type Push struct {
	// OwnerDID is the DID of the repo the manifest record lives in.
	OwnerDID string `json:"owner_did"`
	// Repository is the repository name (io.atcr.manifest repository).
	Repository string `json:"repository"`
	// Digest is the manifest digest, e.g. "sha256:…".
	Digest string `json:"digest"`
	// MediaType is the manifest media type.
	MediaType string `json:"media_type"`
	// HoldDID is the hold storing the blobs (may be empty).
	HoldDID string `json:"hold_did"`
	// HoldEndpoint is the hold's URL when the record carried one.
	HoldEndpoint string `json:"hold_endpoint"`
	// PushedAt is Unix ms (the manifest record's createdAt).
	PushedAt int64 `json:"pushed_at"`
	// EventKey is stable across replays: "push:<did>/<repository>@<digest>"
	// (PushEventKey). Empty means PushEventKey of the fields above.
	EventKey string `json:"event_key"`
}

// PushEventKey is the event key of a push: "push:<did>/<repository>@<digest>".
// It is the X-Appview-Delivery header, so receivers can de-duplicate on it.
func PushEventKey(ownerDID, repository, digest string) string {
	return TriggerPush + ":" + ownerDID + "/" + repository + "@" + digest
}

// subscribersSQL reads the webhooks of a DID and their triggers.
var subscribersSQL = `SELECT id, ` + database.Text("triggers") + ` FROM webhooks WHERE did = ?1 ORDER BY id`

const (
	// enqueueSQL leaves next_attempt_at at the enqueue time: the first delay
	// of webhooks.retry_schedule is added by the dispatcher, which knows the
	// configuration (EnqueueTx runs in the consumer's transaction and does not).
	enqueueSQL = `INSERT INTO webhook_deliveries
  (webhook_id, event_key, trigger_name, trigger_data, status, attempts, next_attempt_at, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, 'pending', 0, ` + database.NowMS + `, ` + database.NowMS + `, ` + database.NowMS + `)
ON CONFLICT (webhook_id, event_key) DO NOTHING`
)

// EnqueueTx records one pending delivery per webhook of OwnerDID subscribed
// to "push", inside the caller's fenced transaction (transactional outbox:
// the delivery commits exactly when the manifest does). It is idempotent
// via UNIQUE(webhook_id, event_key): a replayed or rewound event never
// fires twice. It returns how many deliveries were newly recorded, so the
// caller knows whether to send the dispatcher a Kick after commit.
//
// A push without OwnerDID, Repository or Digest is a programming error:
// EnqueueTx returns an error before writing anything.
func EnqueueTx(ctx context.Context, tx *sql.Tx, pushes []Push) (int, error) {
	for i := range pushes {
		p := &pushes[i]
		if p.OwnerDID == "" || p.Repository == "" || p.Digest == "" {
			return 0, fmt.Errorf("enqueue webhook push %d: owner DID, repository and digest are required (got %q %q %q)",
				i, p.OwnerDID, p.Repository, p.Digest)
		}
	}
	subscribers := map[string][]int64{}
	added := 0
	for _, p := range pushes {
		ids, seen := subscribers[p.OwnerDID]
		if !seen {
			var err error
			if ids, err = pushSubscribers(ctx, tx, p.OwnerDID); err != nil {
				return added, err
			}
			subscribers[p.OwnerDID] = ids
		}
		if len(ids) == 0 {
			continue
		}
		if p.EventKey == "" {
			p.EventKey = PushEventKey(p.OwnerDID, p.Repository, p.Digest)
		}
		data, err := json.Marshal(p)
		if err != nil {
			return added, fmt.Errorf("enqueue webhook push %s: %w", p.EventKey, err)
		}
		for _, id := range ids {
			res, err := tx.ExecContext(ctx, enqueueSQL, id, p.EventKey, TriggerPush, string(data))
			if err != nil {
				return added, fmt.Errorf("enqueue webhook push %s for webhook %d: %w", p.EventKey, id, err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				return added, fmt.Errorf("enqueue webhook push %s for webhook %d: %w", p.EventKey, id, err)
			}
			added += int(n)
		}
	}
	return added, nil
}

// pushSubscribers returns the ids of did's webhooks subscribed to "push".
// A webhook whose triggers column cannot be read is skipped (and cannot be
// fixed from here); the others still get their deliveries.
func pushSubscribers(ctx context.Context, tx *sql.Tx, did string) ([]int64, error) {
	rows, err := tx.QueryContext(ctx, subscribersSQL, did)
	if err != nil {
		return nil, fmt.Errorf("find webhooks of %s: %w", did, err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var (
			id       int64
			triggers string
		)
		if err := rows.Scan(&id, &triggers); err != nil {
			return nil, fmt.Errorf("find webhooks of %s: %w", did, err)
		}
		names, err := ParseTriggers(triggers)
		if err != nil {
			continue
		}
		for _, n := range names {
			if n == TriggerPush {
				ids = append(ids, id)
				break
			}
		}
	}
	return ids, rows.Err()
}
