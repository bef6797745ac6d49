package backfill

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/atcr-io/appview/internal/jetstream"
)

func (r *run) repos(ctx context.Context, col string, refs []repoRef, repos *repoSet) error {
	return r.reposFiltered(ctx, col, refs, repos, false)
}

// reposFiltered is repos; with describe, each DID's PDS is first asked
// whether the repository has records in col (the listRepos fallback).
func (r *run) reposFiltered(ctx context.Context, col string, refs []repoRef, repos *repoSet, describe bool) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan string)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for i := 0; i < r.b.o.Concurrency && i < len(refs); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for did := range work {
				if err := r.repo(wctx, col, did, repos, describe); err != nil {
					once.Do(func() { first = err; cancel() })
				}
			}
		}()
	}
	seen := make(map[string]bool, len(refs))
feed:
	for _, ref := range refs {
		if ref.DID == "" || seen[ref.DID] {
			continue
		}
		seen[ref.DID] = true
		if st := repos.get(ref.DID).state; st == repoDone || st == repoFailed {
			continue
		}
		select {
		case work <- ref.DID:
		case <-wctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// repo backfills one DID's records of col, page by page from its
// checkpointed cursor. A DID that does not resolve or whose PDS fails is
// recorded as failed and skipped (nil error).
//
// With describe, a repository whose PDS says it has no records in col is
// left alone: nothing is fetched or written for it.
func (r *run) repo(ctx context.Context, col, did string, repos *repoSet, describe bool) error {
	pds, err := r.b.o.Resolver.PDSEndpoint(ctx, did)
	if err != nil {
		if fatal(ctx, err) {
			return err
		}
		return r.failRepo(ctx, col, did, classResolve, err, repos)
	}
	if err := r.broken(pds); err != nil {
		return r.failRepo(ctx, col, did, "", fmt.Errorf("PDS %s failed earlier in this run: %w", pds, err), repos)
	}
	if describe {
		has, err := r.hasCollection(ctx, pds, did, col)
		if err != nil {
			return r.pdsFailed(ctx, pds, col, did, err, repos)
		}
		if !has {
			return nil
		}
	}
	cursor := repos.get(did).cursor
	trail := newCursorTrail(cursor)
	for {
		params := url.Values{"repo": {did}, "collection": {col}, "limit": {strconv.Itoa(r.b.o.RecordPageSize)}}
		if cursor != "" {
			params.Set("cursor", cursor)
		}
		var page recordsPage
		if err := r.b.xrpc.get(ctx, pds, methodListRecords, params, &page); err != nil {
			return r.pdsFailed(ctx, pds, col, did, err, repos)
		}
		if page.Cursor != "" && !trail.add(page.Cursor) {
			return r.failRepo(ctx, col, did, classProtocol,
				fmt.Errorf("%s on %s: %s", methodListRecords, pds, cycleMessage("PDS", page.Cursor)), repos)
		}
		last := page.Cursor == "" || len(page.Records) == 0
		if err := r.savePage(ctx, col, did, page, last); err != nil {
			return err
		}
		if last {
			repos.set(did, repoDone)
			r.b.o.Metrics.Repos.WithLabelValues(col, repoDone).Inc()
			return nil
		}
		cursor = page.Cursor
	}
}

// hasCollection asks did's PDS (describeRepo, cached for the run) whether
// the repository has records in col. A describeRepo the PDS cannot answer
// for a reason other than the repository itself (the reference PDS
// resolves the DID and handle to answer, and refuses with 400
// InvalidRequest "Could not resolve DID" when it cannot) is no reason to
// skip the repository: every collection is then listed, which costs one
// listRecords each.
func (r *run) hasCollection(ctx context.Context, pds, did, col string) (bool, error) {
	r.mu.Lock()
	cols, ok := r.collections[did]
	r.mu.Unlock()
	if !ok {
		var d describedRepo
		err := r.b.xrpc.get(ctx, pds, methodDescribeRepo, url.Values{"repo": {did}}, &d)
		switch {
		case err == nil:
			cols = d.Collections
		case !fatal(ctx, err) && describeUnanswered(err):
			r.b.skipLog.Debug().Err(logval.Error(err)).Str("did", logval.String(did)).Msg("describeRepo unanswered; listing every collection")
			cols = []string{allCollections}
		default:
			return false, err
		}
		r.mu.Lock()
		if len(r.collections) >= describeCacheMax {
			clear(r.collections)
		}
		r.collections[did] = cols
		r.mu.Unlock()
	}
	for _, c := range cols {
		if c == col || c == allCollections {
			return true, nil
		}
	}
	return false, nil
}

// allCollections marks a repository whose collections are unknown.
const allCollections = "*"

// describeUnanswered reports whether a describeRepo failure says nothing
// about the repository: a client error other than the repository being
// missing or not served.
func describeUnanswered(err error) bool {
	var xe *xrpcError
	if !errors.As(err, &xe) || xe.class != classClient {
		return false
	}
	switch xe.code {
	case "RepoNotFound", "RepoDeactivated", "RepoTakendown", "RepoSuspended":
		return false
	}
	return true
}

// inactiveRepo reports whether err is a PDS refusing a repository because
// its account is not active (deactivated, taken down, suspended) or is
// gone (atproto.Inactive). A RepoNotFound stays a failure here: the
// backfill found the repository listed by a relay.
func inactiveRepo(err error) bool {
	var xe *xrpcError
	if !errors.As(err, &xe) || xe.class != classClient || xe.code == "RepoNotFound" {
		return false
	}
	return atproto.RepoInactive(xe.code, xe.message)
}

// skipInactive checkpoints an inactive repository as done with no
// records, so neither this run nor a resumed one asks for it again, notes
// it in repo_incomplete (its reactivation re-reads it), and counts it
// under appview_backfill_repos_total{outcome="inactive"}.
func (r *run) skipInactive(ctx context.Context, col, did string, repos *repoSet) error {
	err := r.write(ctx, "page", func(tx *sql.Tx) error {
		if err := noteIncomplete(ctx, tx, incompleteInactive, did); err != nil {
			return err
		}
		return r.checkpoint(ctx, tx, pageCheckpoint{col: col, did: did, state: repoDone, doneRepos: 1})
	})
	if err != nil {
		return err
	}
	repos.set(did, repoDone)
	r.b.o.Metrics.Repos.WithLabelValues(col, repoInactive).Inc()
	return nil
}

// events turns listRecords entries into synthetic Jetstream create events.
// TimeUS is the time the page was fetched. listRecords gives no rev, so
// the events carry none: the processor versions them by that time, below
// every rev (docs/ordering.md). A later read replaces an earlier one, and
// any live event, which carries its commit's rev, replaces both; a read
// never replaces or resurrects what a live event with a rev wrote or
// deleted.
// Entries whose uri is not at://DID/COL/RKEY of this repository and
// collection, or whose value is not a JSON object, are skipped and counted.
func (r *run) events(col, did string, records []recordRef) ([]jetstream.Event, int) {
	now := r.b.o.Now().UnixMicro()
	events := make([]jetstream.Event, 0, len(records))
	invalid := 0
	for _, rec := range records {
		rkey, err := rkeyOf(rec.URI, did, col)
		if err == nil && !isObject(rec.Value) {
			err = errors.New("value is not a JSON object")
		}
		if err != nil {
			invalid++
			r.b.skipLog.Warn().Err(logval.Error(err)).Str("did", logval.String(did)).Str("collection", col).Str("uri", logval.String(rec.URI)).
				Msg("backfill record skipped")
			continue
		}
		events = append(events, jetstream.Event{
			DID:    did,
			TimeUS: now,
			Kind:   jetstream.KindCommit,
			Commit: &jetstream.Commit{
				Operation:  jetstream.OpCreate,
				Collection: col,
				RKey:       rkey,
				Record:     rec.Value,
				CID:        rec.CID,
			},
		})
	}
	return events, invalid
}

// rkeyOf returns the record key of at://DID/COLLECTION/RKEY (AT-URI
// syntax as syntax.ParseATURI checks it), checking that the URI names
// this repository and collection.
func rkeyOf(uri, did, col string) (string, error) {
	u, err := syntax.ParseATURI(uri)
	switch {
	case err != nil || u.RecordKey() == "":
		return "", fmt.Errorf("record uri %q is not at://DID/COLLECTION/RKEY", uri)
	case u.Authority().String() != did:
		return "", fmt.Errorf("record uri %q is not in repository %s", uri, did)
	case u.Collection().String() != col:
		return "", fmt.Errorf("record uri %q is not in collection %s", uri, col)
	}
	return u.RecordKey().String(), nil
}

func isObject(v []byte) bool {
	v = bytes.TrimSpace(v)
	return len(v) > 0 && v[0] == '{'
}

// failRepo records a DID as failed (skipped) for col in this run, notes
// it in repo_incomplete, logs and counts it. Only a failed write is
// returned.
func (r *run) failRepo(ctx context.Context, col, did, class string, cause error, repos *repoSet) error {
	err := r.write(ctx, "repo_failed", func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, failRepoSQL, r.id, col, did, cause.Error()); err != nil {
			return fmt.Errorf("checkpoint failed %s of %s: %w", col, did, err)
		}
		if _, err := tx.ExecContext(ctx, countRunSQL, r.id, 0, 0, 1); err != nil {
			return fmt.Errorf("count backfill run %d: %w", r.id, err)
		}
		return noteIncomplete(ctx, tx, incompleteFailed, did)
	})
	if err != nil {
		return err
	}
	repos.set(did, repoFailed)
	r.b.o.Metrics.Repos.WithLabelValues(col, repoFailed).Inc()
	if class != "" {
		r.b.o.Metrics.Errors.WithLabelValues(class).Inc()
	}
	r.b.skipLog.Warn().Err(logval.Error(cause)).Str("did", logval.String(did)).Str("collection", col).Str("class", class).
		Msg("backfill skipped a repository")
	return nil
}

func (r *run) broken(pds string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.brokenPDS[pds]
}

func (r *run) markBroken(pds string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.brokenPDS[pds]; !ok {
		r.brokenPDS[pds] = err
		r.log.Warn().Err(logval.Error(err)).Str("pds", logval.String(pds)).Msg("PDS failed; skipping its other repositories in this run")
	}
}

// pdsFailed settles a PDS request for did's col that failed with err: a
// stop or database failure is returned as is; a repository the PDS refuses
// as inactive is skipped, not failed (docs/interop.md, "Account
// lifecycle"); anything else fails the repository with its
// class, and a network, server or rate-limit failure marks the PDS broken
// for the rest of the run.
func (r *run) pdsFailed(ctx context.Context, pds, col, did string, err error, repos *repoSet) error {
	if fatal(ctx, err) {
		return err
	}
	if inactiveRepo(err) {
		return r.skipInactive(ctx, col, did, repos)
	}
	class := errorClass(err)
	if class == classNetwork || class == classServer || class == classRateLimited {
		r.markBroken(pds, err)
	}
	return r.failRepo(ctx, col, did, class, err, repos)
}
