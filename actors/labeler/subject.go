package labeler

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/atcr-io/appview/internal/database"
)

// Collections whose records name a repository (docs/lexicons.md).
const (
	collectionRepoPage = "io.atcr.repo.page" // rkey is the repository name
	collectionManifest = "io.atcr.manifest"  // rkey is a TID: the repository is in the record
	collectionTag      = "io.atcr.tag"       // rkey is any: the repository is in the record
)

// Why a label's subject maps to nothing this registry can take down.
var (
	// errUnsupportedSubject: a well-formed subject outside the registry,
	// e.g. a Bluesky post or a profile record.
	errUnsupportedSubject = errors.New("subject is not a registry account or repository")
	// errUnknownRecord: a manifest or tag record this instance has not
	// indexed, so its repository is unknown.
	errUnknownRecord = errors.New("subject record is not indexed")
)

// did is the DID syntax of the AT Protocol (atproto.com/specs/did).
var did = regexp.MustCompile(`^did:[a-z]+:[a-zA-Z0-9._:%-]*[a-zA-Z0-9._-]$`)

// subject is what a takedown applies to: an account (repo "") or one of
// its repositories.
type subject struct {
	did  string
	repo string
}

// resolveSubject maps a label's uri to the account or repository it is
// about: a bare DID or at://DID is the account; at://DID/io.atcr.repo.page/R
// is repository R; a manifest or tag record URI is the repository of that
// record, looked up in the indexed manifests and tags. Errors: a malformed
// uri wraps errMalformed; errUnsupportedSubject; errUnknownRecord; or a
// database error.
func resolveSubject(ctx context.Context, tx *sql.Tx, uri string) (subject, error) {
	if strings.HasPrefix(uri, "did:") {
		if !did.MatchString(uri) {
			return subject{}, fmt.Errorf("%w subject %q: not a DID", errMalformed, uri)
		}
		return subject{did: uri}, nil
	}
	rest, ok := strings.CutPrefix(uri, "at://")
	if !ok || strings.ContainsAny(rest, "?#") {
		return subject{}, fmt.Errorf("%w subject %q: want a DID or at://DID[/COLLECTION/RKEY]", errMalformed, uri)
	}
	parts := strings.Split(strings.TrimSuffix(rest, "/"), "/")
	if !did.MatchString(parts[0]) {
		// A handle authority would need resolving and could change hands;
		// labelers address subjects by DID.
		return subject{}, fmt.Errorf("%w subject %q: authority is not a DID", errMalformed, uri)
	}
	s := subject{did: parts[0]}
	switch {
	case len(parts) == 1:
		return s, nil
	case len(parts) != 3 || parts[1] == "" || parts[2] == "":
		return subject{}, fmt.Errorf("%w subject %q: want at://DID/COLLECTION/RKEY", errMalformed, uri)
	}
	collection, rkey := parts[1], parts[2]
	var query string
	switch collection {
	case collectionRepoPage:
		s.repo = rkey
		return s, nil
	case collectionManifest:
		query = `SELECT ` + database.Text("repository") + ` FROM manifests WHERE did = ?1 AND rkey = ?2 LIMIT 1`
	case collectionTag:
		query = `SELECT ` + database.Text("repository") + ` FROM tags WHERE did = ?1 AND rkey = ?2 LIMIT 1`
	default:
		return subject{}, fmt.Errorf("subject %q: %w", uri, errUnsupportedSubject)
	}
	err := tx.QueryRowContext(ctx, query, s.did, rkey).Scan(&s.repo)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return subject{}, fmt.Errorf("subject %q: %w", uri, errUnknownRecord)
	case err != nil:
		return subject{}, fmt.Errorf("look up subject %q: %w", uri, err)
	}
	return s, nil
}
