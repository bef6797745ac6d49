package webhooks

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/identity"
)

// PushPayload is the JSON body of a "push" delivery. Its shape follows
// Docker Hub's repository webhook (push_data, repository) so receivers
// written for it read ours, plus the hold that stores the blobs.
type PushPayload struct {
	// Trigger is "push".
	Trigger    string         `json:"trigger"`
	PushData   PushData       `json:"push_data"`
	Repository RepositoryInfo `json:"repository"`
	Hold       HoldInfo       `json:"hold"`
}

// PushData describes the push itself.
type PushData struct {
	// PushedAt is Unix seconds (as Docker Hub sends it), from the manifest
	// record's createdAt.
	PushedAt int64 `json:"pushed_at"`
	// Pusher is the owner's handle, or the DID when no handle is known.
	Pusher string `json:"pusher"`
	// PusherDID is the owner's DID.
	PusherDID string `json:"pusher_did"`
	// Tag is a tag pointing at Digest when the body was built ("" for a
	// tagless push).
	Tag string `json:"tag"`
	// Digest is the manifest digest.
	Digest string `json:"digest"`
}

// RepositoryInfo describes the repository pushed to.
type RepositoryInfo struct {
	// Name is the repository name, e.g. "app".
	Name string `json:"name"`
	// Namespace is the owner's handle, or the DID when no handle is known.
	Namespace string `json:"namespace"`
	// RepoName is "<namespace>/<name>".
	RepoName string `json:"repo_name"`
	// RepoURL is "<webhooks.public_url>/r/<namespace>/<name>".
	RepoURL string `json:"repo_url"`
	// MediaType is the manifest media type.
	MediaType string `json:"media_type"`
	// StarCount and PullCount come from repository_stats when the body was built.
	StarCount int64 `json:"star_count"`
	PullCount int64 `json:"pull_count"`
}

// HoldInfo names the hold storing the pushed blobs.
type HoldInfo struct {
	// DID is the hold's DID ("" when unknown).
	DID string `json:"did"`
	// Endpoint is the hold's URL: the manifest's hold_endpoint, or derived
	// from a did:web hold DID (identity.HoldEndpointFromDID); "" for other
	// DID methods, which would need resolution.
	Endpoint string `json:"endpoint"`
}

// errBadTriggerData marks stored trigger data that can never be rendered:
// the delivery is given up rather than retried.
var errBadTriggerData = errors.New("bad push trigger data")

// buildPushPayload renders the body of a push delivery from its trigger
// data and the registry tables as they are now (inside the claim's
// transaction). publicURL is webhooks.public_url.
func buildPushPayload(ctx context.Context, tx *sql.Tx, triggerData, publicURL string) ([]byte, error) {
	var p Push
	if err := json.Unmarshal([]byte(triggerData), &p); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadTriggerData, err)
	}
	if p.OwnerDID == "" || p.Repository == "" || p.Digest == "" {
		return nil, fmt.Errorf("%w: owner DID, repository and digest are required", errBadTriggerData)
	}

	var handle string
	err := tx.QueryRowContext(ctx, `SELECT `+database.Text("handle")+` FROM users WHERE did = ?1`, p.OwnerDID).Scan(&handle)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("read handle of %s: %w", p.OwnerDID, err)
	}
	namespace := handle
	if namespace == "" {
		namespace = p.OwnerDID
	}

	var holdDID, holdEndpoint, mediaType string
	err = tx.QueryRowContext(ctx,
		`SELECT `+database.Text("hold_did")+`, `+database.Text("hold_endpoint")+`, `+database.Text("media_type")+`
		 FROM manifests WHERE did = ?1 AND repository = ?2 AND digest = ?3`,
		p.OwnerDID, p.Repository, p.Digest).Scan(&holdDID, &holdEndpoint, &mediaType)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("read manifest %s: %w", p.EventKey, err)
	}
	holdDID = firstNonEmpty(p.HoldDID, holdDID)
	derived, _ := identity.HoldEndpointFromDID(holdDID, "https")
	holdEndpoint = firstNonEmpty(holdEndpoint, p.HoldEndpoint, derived)
	mediaType = firstNonEmpty(p.MediaType, mediaType)

	var tag string
	err = tx.QueryRowContext(ctx,
		`SELECT `+database.Text("tag")+` FROM tags WHERE did = ?1 AND repository = ?2 AND digest = ?3
		 ORDER BY updated_at DESC, tag LIMIT 1`,
		p.OwnerDID, p.Repository, p.Digest).Scan(&tag)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("read tags of %s: %w", p.EventKey, err)
	}

	var stars, pulls int64
	err = tx.QueryRowContext(ctx,
		`SELECT star_count, pull_count FROM repository_stats WHERE did = ?1 AND repository = ?2`,
		p.OwnerDID, p.Repository).Scan(&stars, &pulls)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("read stats of %s/%s: %w", p.OwnerDID, p.Repository, err)
	}

	body := PushPayload{
		Trigger: TriggerPush,
		PushData: PushData{
			PushedAt:  p.PushedAt / 1000,
			Pusher:    namespace,
			PusherDID: p.OwnerDID,
			Tag:       tag,
			Digest:    p.Digest,
		},
		Repository: RepositoryInfo{
			Name:      p.Repository,
			Namespace: namespace,
			RepoName:  namespace + "/" + p.Repository,
			RepoURL:   repoURL(publicURL, namespace, p.Repository),
			MediaType: mediaType,
			StarCount: stars,
			PullCount: pulls,
		},
		Hold: HoldInfo{DID: holdDID, Endpoint: holdEndpoint},
	}
	return json.Marshal(body)
}

// repoURL is <base>/r/<namespace>/<name>, each path segment escaped.
func repoURL(base, namespace, name string) string {
	segs := append([]string{"r", namespace}, strings.Split(name, "/")...)
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.TrimRight(base, "/") + "/" + strings.Join(segs, "/")
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}
