package webhooks

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"

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

// subscribersSQL reads the webhooks of a list of DIDs (%s: one ?
// each) and their triggers.
var subscribersSQL = `SELECT ` + database.Text("did") + `, id, ` + database.Text("triggers") + ` FROM webhooks WHERE did IN (%s) ORDER BY id`

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
	owners := make([]string, 0, len(pushes))
	for i := range pushes {
		if !slices.Contains(owners, pushes[i].OwnerDID) {
			owners = append(owners, pushes[i].OwnerDID)
		}
	}
	subscribers, err := pushSubscribers(ctx, tx, owners)
	if err != nil {
		return 0, err
	}
	added := 0
	for _, p := range pushes {
		ids := subscribers[p.OwnerDID]
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

// subscribersChunk bounds the DIDs per subscribers query (one parameter
// each, far below SQLite's 32,766).
const subscribersChunk = 500

// pushSubscribers returns, for each of dids that has any, the ids of its
// webhooks subscribed to "push", in id order: one query per
// subscribersChunk DIDs, not one per DID, since it runs in every batch
// that stores a manifest (the consumer's hot path). A webhook whose
// triggers column cannot be read is skipped (and cannot be fixed from
// here); the others still get their deliveries.
func pushSubscribers(ctx context.Context, tx *sql.Tx, dids []string) (map[string][]int64, error) {
	out := map[string][]int64{}
	for len(dids) > 0 {
		chunk := dids[:min(len(dids), subscribersChunk)]
		dids = dids[len(chunk):]
		if err := pushSubscribersChunk(ctx, tx, chunk, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func pushSubscribersChunk(ctx context.Context, tx *sql.Tx, dids []string, out map[string][]int64) error {
	args := make([]any, len(dids))
	for i, d := range dids {
		args[i] = d
	}
	q := fmt.Sprintf(subscribersSQL, database.InList(len(args)))
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("find webhooks of %d DIDs: %w", len(dids), err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			did      string
			id       int64
			triggers string
		)
		if err := rows.Scan(&did, &id, &triggers); err != nil {
			return fmt.Errorf("find webhooks of %d DIDs: %w", len(dids), err)
		}
		names, err := ParseTriggers(triggers)
		if err != nil {
			continue
		}
		if slices.Contains(names, TriggerPush) {
			out[did] = append(out[did], id)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("find webhooks of %d DIDs: %w", len(dids), err)
	}
	return nil
}
