package backfill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"

	"github.com/rs/zerolog"
)

// run is one backfill run in progress under one custody.
type run struct {
	b       *Backfiller
	custody fence.Custody
	id      int64
	log     zerolog.Logger

	mu sync.Mutex
	// brokenPDS remembers PDSes that failed without an answer or with 5xx
	// or 429 after retries, so their other repositories fail fast in this
	// run instead of each waiting out the retries.
	brokenPDS map[string]error
	// fallback marks relays found without listReposByCollection in this
	// run: they are walked with listRepos (walkAllRepos).
	fallback map[string]bool
	// collections caches describeRepo answers for this run (DID → its
	// collections), so the fallback asks each repository once, not once per
	// collection; bounded by describeCacheMax.
	collections map[string][]string
	// noted are the DIDs listed inactive already noted in repo_incomplete
	// in this run (noteInactive); bounded by describeCacheMax.
	noted map[string]bool
}

// describeCacheMax bounds the describeRepo cache of one run; past it the
// cache is emptied and repositories are asked again.
const describeCacheMax = 100_000

// listReposCursorPrefix marks a collection checkpoint whose relay cursor
// is a listRepos cursor (the fallback), so a resumed run goes on with the
// same method.
const listReposCursorPrefix = "listRepos:"

func (r *run) write(ctx context.Context, what string, fn func(tx *sql.Tx) error) error {
	return r.b.write(ctx, r.custody, what, fn)
}

// collection backfills one collection: the stored relay first (from its
// stored cursor), then the other relays in order, each from the start.
func (r *run) collection(ctx context.Context, col string) error {
	var st collectionState
	var done int
	err := r.b.o.DB.QueryRowContext(ctx, collectionSQL, r.id, col).Scan(&st.relay, &st.cursor, &done)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("read checkpoint of %s: %w", col, err)
	}
	if done != 0 {
		return nil
	}
	repos, err := r.repoStates(ctx, col)
	if err != nil {
		return err
	}
	relays := make([]string, 0, len(r.b.o.RelayEndpoints))
	for _, rel := range r.b.o.RelayEndpoints {
		if rel == st.relay {
			relays = append([]string{rel}, relays...)
		} else {
			relays = append(relays, rel)
		}
	}
	var errs []error
	for i, relay := range relays {
		cursor := ""
		if relay == st.relay {
			cursor = st.cursor
		} else if err := r.saveCollection(ctx, col, relay, "", false); err != nil {
			return err
		}
		err := r.walk(ctx, col, relay, cursor, repos)
		if err == nil {
			return r.saveCollection(ctx, col, relay, "", true)
		}
		var xe *xrpcError
		if fatal(ctx, err) || !errors.As(err, &xe) {
			return err
		}
		r.b.o.Metrics.Errors.WithLabelValues(classRelay).Inc()
		ev := r.log.Warn()
		if i == len(relays)-1 || r.b.failing.Load() {
			ev = r.log.Debug() // the attempt's failure says it, once (failing.go)
		}
		ev.Err(logval.Error(err)).Str("collection", col).Str("relay", relay).Msg("relay failed; trying the next")
		errs = append(errs, err)
	}
	return fmt.Errorf("list %s: %w: %w", col, errAllRelaysFailed, errors.Join(errs...))
}

func (r *run) saveCollection(ctx context.Context, col, relay, cursor string, done bool) error {
	what := "relay_cursor"
	if done {
		what = "collection_done"
	}
	return r.write(ctx, what, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, saveCollectionSQL, r.id, col, relay, cursor, done)
		return err
	})
}

// repoSet is the checkpoint of every DID of one collection, kept current
// as DIDs finish.
type repoSet struct {
	mu     sync.Mutex
	states map[string]repoState
}

func (s *repoSet) get(did string) repoState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.states[did]
}

func (s *repoSet) set(did, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.states[did] = repoState{state: state}
}

func (r *run) repoStates(ctx context.Context, col string) (*repoSet, error) {
	rows, err := r.b.o.DB.QueryContext(ctx, repoStatesSQL, r.id, col)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint of %s repositories: %w", col, err)
	}
	defer rows.Close()
	set := &repoSet{states: map[string]repoState{}}
	for rows.Next() {
		var did string
		var st repoState
		if err := rows.Scan(&did, &st.state, &st.cursor); err != nil {
			return nil, fmt.Errorf("read checkpoint of %s repositories: %w", col, err)
		}
		set.states[did] = st
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read checkpoint of %s repositories: %w", col, err)
	}
	return set, nil
}

// walk pages through one relay's listing of col from cursor, backfilling
// each page's DIDs before checkpointing the next page's cursor.
//
// A relay without listReposByCollection (it answers 404, as Bluesky's relay
// does) is walked with listRepos instead (walkAllRepos).
func (r *run) walk(ctx context.Context, col, relay, cursor string, repos *repoSet) error {
	if rest, ok := strings.CutPrefix(cursor, listReposCursorPrefix); ok || r.usesFallback(relay) {
		return r.walkAllRepos(ctx, col, relay, rest, repos)
	}
	first := true
	trail := newCursorTrail(cursor)
	for {
		params := url.Values{"collection": {col}, "limit": {strconv.Itoa(r.b.o.RelayPageSize)}}
		if cursor != "" {
			params.Set("cursor", cursor)
		}
		var page reposPage
		if err := r.b.xrpc.get(ctx, relay, methodListRepos, params, &page); err != nil {
			if first && !fatal(ctx, err) && methodMissing(err) {
				r.setFallback(relay, err)
				return r.walkAllRepos(ctx, col, relay, "", repos)
			}
			if !fatal(ctx, err) {
				r.b.o.Metrics.Errors.WithLabelValues(errorClass(err)).Inc()
			}
			return err
		}
		if err := r.repos(ctx, col, page.Repos, repos); err != nil {
			return err
		}
		if page.Cursor == "" || len(page.Repos) == 0 {
			return nil
		}
		if !trail.add(page.Cursor) {
			return &xrpcError{method: methodListRepos, host: relay, class: classProtocol,
				message: cycleMessage("relay", page.Cursor)}
		}
		cursor, first = page.Cursor, false
		if err := r.saveCollection(ctx, col, relay, cursor, false); err != nil {
			return err
		}
	}
}

func (r *run) usesFallback(relay string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fallback[relay]
}

func (r *run) setFallback(relay string, why error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.fallback[relay] {
		r.fallback[relay] = true
		r.log.Info().Str("relay", relay).Str("why", why.Error()).
			Msg("relay has no listReposByCollection; listing every repository with listRepos and asking each PDS (describeRepo) which collections it has")
	}
}

// walkAllRepos is the fallback for a relay without listReposByCollection:
// it pages through com.atproto.sync.listRepos (which every relay and PDS
// serves) and backfills col for each listed repository that is active and
// whose PDS says (describeRepo) it has records in col. Repositories listed
// inactive (deactivated, taken down, suspended, deleted) are skipped: their
// PDS refuses to list their records (docs/interop.md, "Account
// lifecycle"); they are noted in repo_incomplete, once per run
// (noteInactive), so their reactivation re-reads them. Its cursor is
// checkpointed with listReposCursorPrefix.
func (r *run) walkAllRepos(ctx context.Context, col, relay, cursor string, repos *repoSet) error {
	trail := newCursorTrail(cursor)
	for {
		params := url.Values{"limit": {strconv.Itoa(r.b.o.RelayPageSize)}}
		if cursor != "" {
			params.Set("cursor", cursor)
		}
		var page allReposPage
		if err := r.b.xrpc.get(ctx, relay, methodListAllRepos, params, &page); err != nil {
			if !fatal(ctx, err) {
				r.b.o.Metrics.Errors.WithLabelValues(errorClass(err)).Inc()
			}
			return err
		}
		refs := make([]repoRef, 0, len(page.Repos))
		var inactive []string
		for _, rp := range page.Repos {
			if rp.Active != nil && !*rp.Active {
				status := ""
				if rp.Status != nil {
					status = *rp.Status
				}
				r.b.skipLog.Debug().Str("did", rp.DID).Str("status", status).Msg("backfill skips an inactive repository")
				if rp.DID != "" {
					inactive = append(inactive, rp.DID)
				}
				continue
			}
			refs = append(refs, repoRef{DID: rp.DID})
		}
		if err := r.noteInactive(ctx, inactive); err != nil {
			return err
		}
		if err := r.reposFiltered(ctx, col, refs, repos, true); err != nil {
			return err
		}
		if page.Cursor == "" || len(page.Repos) == 0 {
			return nil
		}
		if !trail.add(page.Cursor) {
			return &xrpcError{method: methodListAllRepos, host: relay, class: classProtocol,
				message: cycleMessage("relay", page.Cursor)}
		}
		cursor = page.Cursor
		if err := r.saveCollection(ctx, col, relay, listReposCursorPrefix+cursor, false); err != nil {
			return err
		}
	}
}

// noteInactive notes the repositories a listRepos page lists inactive in
// repo_incomplete, each once per run (the fallback walks listRepos once
// per collection), in one fenced transaction.
func (r *run) noteInactive(ctx context.Context, dids []string) error {
	r.mu.Lock()
	fresh := dids[:0:0]
	for _, d := range dids {
		if !r.noted[d] {
			if len(r.noted) >= describeCacheMax {
				clear(r.noted)
			}
			r.noted[d] = true
			fresh = append(fresh, d)
		}
	}
	r.mu.Unlock()
	if len(fresh) == 0 {
		return nil
	}
	return r.write(ctx, "repo_inactive", func(tx *sql.Tx) error {
		return noteIncomplete(ctx, tx, incompleteInactive, fresh...)
	})
}
