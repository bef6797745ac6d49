package labeler

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/atcr-io/appview/internal/database"
	"github.com/bluesky-social/indigo/atproto/syntax"
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
)

// subject is what a takedown applies to: an account (repo "") or one of
// its repositories. For a manifest or tag record, collection and rkey name
// the record, and pending is true while that record is not indexed here
// (its repository, and so repo, is not known yet).
type subject struct {
	did              string
	repo             string
	collection, rkey string
	pending          bool
}

// recordRepoSQL returns the repository of the manifest or tag record
// (did, rkey), by the record's collection.
var recordRepoSQL = map[string]string{
	collectionManifest: `SELECT ` + database.Text("repository") + ` FROM manifests WHERE did = ?1 AND rkey = ?2 LIMIT 1`,
	collectionTag:      `SELECT ` + database.Text("repository") + ` FROM tags WHERE did = ?1 AND rkey = ?2 LIMIT 1`,
}

// querier is a *database.DB or a *sql.Tx.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// recordRepo looks up the repository of the indexed manifest or tag record
// (did, collection, rkey); found is false when it is not indexed.
func recordRepo(ctx context.Context, q querier, did, collection, rkey string) (repo string, found bool, err error) {
	err = q.QueryRowContext(ctx, recordRepoSQL[collection], did, rkey).Scan(&repo)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("look up the repository of at://%s/%s/%s: %w", did, collection, rkey, err)
	}
	return repo, true, nil
}

// resolveSubject maps a label's uri to the account or repository it is
// about: a bare DID or at://DID is the account; at://DID/io.atcr.repo.page/R
// is repository R; a manifest or tag record URI is the repository of that
// record, looked up in the indexed manifests and tags (pending when it is
// not indexed). Errors: a malformed uri wraps errMalformed;
// errUnsupportedSubject; or a database error.
func resolveSubject(ctx context.Context, tx *sql.Tx, uri string) (subject, error) {
	if strings.HasPrefix(uri, "did:") {
		if _, err := syntax.ParseDID(uri); err != nil {
			return subject{}, fmt.Errorf("%w subject %q: not a DID: %v", errMalformed, uri, err)
		}
		return subject{did: uri}, nil
	}
	u, err := syntax.ParseATURI(uri)
	if err != nil {
		return subject{}, fmt.Errorf("%w subject %q: want a DID or at://DID[/COLLECTION/RKEY]: %v", errMalformed, uri, err)
	}
	if !u.Authority().IsDID() {
		// A handle authority would need resolving and could change hands;
		// labelers address subjects by DID.
		return subject{}, fmt.Errorf("%w subject %q: authority is not a DID", errMalformed, uri)
	}
	s := subject{did: u.Authority().String()}
	switch {
	case u.Path() == "":
		return s, nil
	case u.RecordKey() == "":
		// A whole collection: well-formed, but not an account or a
		// repository.
		return subject{}, fmt.Errorf("subject %q: %w", uri, errUnsupportedSubject)
	}
	s.collection, s.rkey = u.Collection().String(), u.RecordKey().String()
	switch s.collection {
	case collectionRepoPage:
		s.repo = s.rkey
		return s, nil
	case collectionManifest, collectionTag:
		repo, found, err := recordRepo(ctx, tx, s.did, s.collection, s.rkey)
		s.repo, s.pending = repo, !found
		return s, err
	default:
		return subject{}, fmt.Errorf("subject %q: %w", uri, errUnsupportedSubject)
	}
}
