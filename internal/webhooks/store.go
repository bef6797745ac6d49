package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/outbound"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// TriggerPush is the trigger fired when a manifest is newly stored.
const TriggerPush = "push"

// knownTriggers are the trigger names a webhook may subscribe to.
var knownTriggers = map[string]bool{TriggerPush: true}

// ErrNotFound is returned by Remove when no webhook has the given id.
var ErrNotFound = errors.New("webhook not found")

// Webhook is one row of the webhooks table (docs/spec.md §8).
type Webhook struct {
	ID int64 `json:"id"`
	// DID owns the repositories whose events are delivered.
	DID string `json:"did"`
	// URL receives the POSTs (http or https).
	URL string `json:"url"`
	// Secret keys the HMAC-SHA256 body signature; empty sends unsigned.
	// Never printed.
	Secret string `json:"-"`
	// Triggers are the trigger names subscribed to, e.g. ["push"].
	Triggers []string `json:"triggers"`
	// CreatedAt is Unix ms on the database clock.
	CreatedAt int64 `json:"created_at"`
}

// Signed reports whether deliveries carry X-Appview-Signature.
func (w Webhook) Signed() bool { return w.Secret != "" }

// ErrInvalid is wrapped by every error of Check (and so of Add) that is
// about the webhook given (its DID, URL or triggers) rather than about
// reaching the network or the database; a *RefusedError (a non-public
// address) wraps ErrRefused instead.
var ErrInvalid = errors.New("invalid webhook")

// invalidError is a Check error that wraps ErrInvalid while keeping its
// own message.
type invalidError struct{ err error }

func (e *invalidError) Error() string        { return e.err.Error() }
func (e *invalidError) Unwrap() error        { return e.err }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(format string, args ...any) error {
	return &invalidError{err: fmt.Errorf(format, args...)}
}

// Check validates w as Add does, without storing it, and returns it with
// its triggers normalized and its URL in canonical form (SameURL: scheme
// and host in lower case, no default port, no fragment). The DID must look like did:<method>:<id>; the
// URL must pass g.CheckURL (a non-public address is a *RefusedError unless
// g.AllowPrivate); Triggers default to ["push"] and every name must be
// known. Errors about w wrap ErrInvalid or ErrRefused; a failed DNS lookup
// other than "no such host" wraps neither.
//
// The local checks (DID, secret, triggers) come before the URL's, which
// may resolve the host: a mistyped trigger is reported as such, not as
// the DNS failure of a host the machine cannot resolve.
func Check(ctx context.Context, w Webhook, g Guard) (Webhook, error) {
	if err := CheckDID(w.DID); err != nil {
		return w, err
	}
	if err := checkSecret(w.Secret); err != nil {
		return w, err
	}
	triggers, err := normalizeTriggers(w.Triggers)
	if err != nil {
		return w, err
	}
	u, err := g.CheckURL(ctx, w.URL)
	if err != nil {
		return w, err
	}
	w.URL = outbound.CanonicalURL(u)
	w.Triggers = triggers
	return w, nil
}

// Add validates w (Check) and stores it, returning its id. ID and
// CreatedAt of w are ignored.
func Add(ctx context.Context, db *database.DB, w Webhook, g Guard) (int64, error) {
	w, err := Check(ctx, w, g)
	if err != nil {
		return 0, err
	}
	encoded, _ := json.Marshal(w.Triggers)
	var id int64
	// RETURNING yields a row, so this is a query (go-libsql refuses it under
	// Exec), read to the end so a failed commit is not mistaken for success.
	_, err = database.QueryReturning(ctx, db,
		`INSERT INTO webhooks (did, url, secret, triggers, created_at)
		 VALUES (?1, ?2, ?3, ?4, `+database.NowMS+`) RETURNING id`,
		[]any{w.DID, w.URL, w.Secret, string(encoded)}, &id)
	if err != nil {
		return 0, fmt.Errorf("add webhook: %w", err)
	}
	return id, nil
}

// List returns the webhooks of did ("" for all), ordered by id.
func List(ctx context.Context, db *database.DB, did string) ([]Webhook, error) {
	var out []Webhook
	err := database.Bounded(ctx, func() error {
		rows, err := db.QueryContext(ctx,
			`SELECT id, `+database.Text("did")+`, `+database.Text("url")+`, `+database.Text("secret")+`, `+
				database.Text("triggers")+`, created_at FROM webhooks
			 WHERE ?1 = '' OR did = ?1 ORDER BY id`, did)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				w        Webhook
				triggers string
			)
			if err := rows.Scan(&w.ID, &w.DID, &w.URL, &w.Secret, &triggers, &w.CreatedAt); err != nil {
				return err
			}
			if w.Triggers, err = ParseTriggers(triggers); err != nil {
				return fmt.Errorf("webhook %d: %w", w.ID, err)
			}
			out = append(out, w)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	return out, nil
}

// Remove deletes the webhook and its deliveries (pending ones are dropped;
// a request in flight finishes, but its outcome is not recorded). It
// returns ErrNotFound when there is no such webhook.
func Remove(ctx context.Context, db *database.DB, id int64) error {
	err := database.Bounded(ctx, func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		// Explicit rather than relying on ON DELETE CASCADE: foreign keys
		// are a per-connection setting a libSQL server may not have on.
		if _, err := tx.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE webhook_id = ?1`, id); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM webhooks WHERE id = ?1`, id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fmt.Errorf("webhook %d: %w", id, ErrNotFound)
		}
		return tx.Commit()
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("remove webhook %d: %w", id, err)
	}
	return err
}

// ParseTriggers reads the webhooks.triggers column: a JSON array of names
// (`["push"]`) or a comma-separated list (`push, push`). Blank names are
// dropped; unknown names are kept (a newer version may know them).
func ParseTriggers(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	var names []string
	if strings.HasPrefix(s, "[") {
		if err := json.Unmarshal([]byte(s), &names); err != nil {
			return nil, fmt.Errorf("triggers %q: not a JSON array of strings: %w", s, err)
		}
	} else {
		names = strings.Split(s, ",")
	}
	out := names[:0]
	for _, n := range names {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out, nil
}

func normalizeTriggers(in []string) ([]string, error) {
	if len(in) == 0 {
		return []string{TriggerPush}, nil
	}
	seen := map[string]bool{}
	var out []string
	for _, t := range in {
		t = strings.TrimSpace(t)
		if t == "" {
			return nil, invalid("blank webhook trigger (known: %s)", TriggerPush)
		}
		if !knownTriggers[t] {
			return nil, invalid("unknown webhook trigger %q (known: %s)", t, TriggerPush)
		}
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out, nil
}

// CheckDID accepts a DID by the AT Protocol syntax (atproto.com/specs/did),
// as syntax.ParseDID checks it, and refuses any other with an error
// wrapping ErrInvalid, one line without the library's own wording:
// `webhooks add` and `webhooks list --did` refuse a DID in the same words.
func CheckDID(did string) error {
	if _, err := syntax.ParseDID(did); err != nil {
		shown := did
		if len(shown) > 64 { // its start only: the refusal is one readable line
			shown = strings.ToValidUTF8(did[:48], "") + "..."
		}
		if len(did) > maxDIDBytes {
			return invalid("webhook did %q is %d bytes: a DID has at most %d", shown, len(did), maxDIDBytes)
		}
		return invalid("webhook did %q: want did:<method>:<id>, e.g. did:plc:abc123", shown)
	}
	return nil
}

// maxDIDBytes is the longest DID the AT Protocol allows (2 KiB,
// atproto.com/specs/did), as syntax.ParseDID checks it.
const maxDIDBytes = 2 * 1024
