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
	// errUnknownRecord: a manifest or tag record this instance has not
	// indexed, so its repository is unknown.
	errUnknownRecord = errors.New("subject record is not indexed")
)

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
	collection, rkey := u.Collection().String(), u.RecordKey().String()
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
	err = tx.QueryRowContext(ctx, query, s.did, rkey).Scan(&s.repo)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return subject{}, fmt.Errorf("subject %q: %w", uri, errUnknownRecord)
	case err != nil:
		return subject{}, fmt.Errorf("look up subject %q: %w", uri, err)
	}
	return s, nil
}
