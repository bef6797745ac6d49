package processor

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/jetstream"
)

// HandleResolver verifies handles: *identity.Resolver implements it.
// Handle returns a DID's handle verified both ways ("" when the DID
// document declares none or it does not resolve back); RefreshHandle does
// so after dropping what its cache held for the DID.
type HandleResolver interface {
	Handle(ctx context.Context, did string) (string, error)
	RefreshHandle(ctx context.Context, did string) (string, error)
}

// Bounds of PrepareBatch's lookups: they run before the batch's
// transaction and delay it, so a slow directory must not stall ingestion.
const (
	// handleBatchBudget bounds all of one batch's lookups together: during
	// a directory outage a batch waits at most this long (failures are
	// cached by the resolver, so the next batches do not wait again).
	handleBatchBudget = 2 * time.Second
	// handleLookups bounds the lookups in flight at once.
	handleLookups = 8
	// knownUsersMax bounds the in-process set of DIDs known to have a users
	// row (cleared when full).
	knownUsersMax = 100_000
	// usersInChunk bounds the DIDs of one IN (...) list (SQLite's variable
	// limit is far above it).
	usersInChunk = 500
)

type handlesKey struct{}

// verifiedHandles is what PrepareBatch found: DID → verified handle ("" =
// none verifies, which clears users.handle).
type verifiedHandles map[string]string

func handlesFrom(ctx context.Context) verifiedHandles {
	h, _ := ctx.Value(handlesKey{}).(verifiedHandles)
	return h
}

// PrepareBatch resolves the handles a batch needs, before its transaction
// opens (the lookups are network requests and must not hold the
// database's write lock), and returns ctx carrying them for ApplyTx:
//
//   - for every #identity event, the DID's cached identity is purged and
//     its handle verified afresh (AT Protocol: an #identity event means the
//     DID document or handle may have changed; Bluesky's relay sends it
//     without a handle, so the event's own handle is not relied on);
//   - for every DID with a record in the batch and no users row yet, or a
//     row without a handle (an earlier lookup failed), its handle is
//     verified, so a new user's row starts with its handle and a missing
//     one is filled in once it verifies.
//
// A lookup that fails (network, directory down) leaves that DID out: the
// event's handle, if any, is used as before and the row keeps what it had.
// With no resolver configured, or db nil, it returns ctx unchanged.
func (p *Processor) PrepareBatch(ctx context.Context, db *sql.DB, events []jetstream.Event) context.Context {
	if p.handles == nil {
		return ctx
	}
	refresh := map[string]bool{}
	var commitDIDs []string
	seen := map[string]bool{}
	for i := range events {
		ev := &events[i]
		switch {
		case ev.Kind == jetstream.KindIdentity && ev.DID != "":
			refresh[ev.DID] = true
		case ev.Kind == jetstream.KindCommit && ev.Commit != nil && ev.DID != "" && !seen[ev.DID] &&
			strings.HasPrefix(ev.Commit.Collection, "io.atcr.") && ev.Commit.Operation != jetstream.OpDelete:
			seen[ev.DID] = true
			commitDIDs = append(commitDIDs, ev.DID)
		}
	}
	var unknown []string
	commitDIDs = p.notKnown(commitDIDs)
	if db != nil && len(commitDIDs) > 0 {
		known, err := knownUsers(ctx, db, commitDIDs)
		if err != nil {
			p.sampled.Warn().Err(err).Msg("read users before resolving handles")
		} else {
			for _, d := range commitDIDs {
				if known[d] {
					p.remember(d)
				} else if !refresh[d] {
					unknown = append(unknown, d)
				}
			}
		}
	}
	if len(refresh) == 0 && len(unknown) == 0 {
		return ctx
	}
	out := verifiedHandles{}
	var mu sync.Mutex
	bctx, cancel := context.WithTimeout(ctx, handleBatchBudget)
	defer cancel()
	sem := make(chan struct{}, handleLookups)
	var wg sync.WaitGroup
	lookup := func(did string, fn func(context.Context, string) (string, error)) {
		defer wg.Done()
		select {
		case sem <- struct{}{}:
		case <-bctx.Done():
			return
		}
		defer func() { <-sem }()
		h, err := fn(bctx, did)
		if err != nil {
			p.sampled.Warn().Err(err).Str("did", did).Msg("handle not verified; keeping what the users row has")
			return
		}
		mu.Lock()
		out[did] = h
		mu.Unlock()
	}
	for did := range refresh {
		wg.Add(1)
		go lookup(did, p.handles.RefreshHandle)
	}
	for _, did := range unknown {
		wg.Add(1)
		go lookup(did, p.handles.Handle)
	}
	wg.Wait()
	return context.WithValue(ctx, handlesKey{}, out)
}

// notKnown returns the DIDs not yet seen with a users row by this process.
func (p *Processor) notKnown(dids []string) []string {
	p.knownMu.Lock()
	defer p.knownMu.Unlock()
	out := dids[:0:0]
	for _, d := range dids {
		if !p.known[d] {
			out = append(out, d)
		}
	}
	return out
}

// remember notes that did has a users row with a handle (rows are created
// once and a handle, once set, changes only with #identity events).
func (p *Processor) remember(did string) {
	p.knownMu.Lock()
	defer p.knownMu.Unlock()
	if p.known == nil || len(p.known) >= knownUsersMax {
		p.known = map[string]bool{}
	}
	p.known[did] = true
}

// knownUsers returns which of dids have a users row with a handle. A row
// without one (its first lookup failed: directory down, timeout) is not
// known, so a later batch with a record of that DID verifies its handle
// again (the resolver caches a failure for a while, so this costs at most
// one lookup per DID per failure TTL) and ensureUser fills it in.
func knownUsers(ctx context.Context, db *sql.DB, dids []string) (map[string]bool, error) {
	known := map[string]bool{}
	for start := 0; start < len(dids); start += usersInChunk {
		chunk := dids[start:min(start+usersInChunk, len(dids))]
		args := make([]any, len(chunk))
		marks := make([]string, len(chunk))
		for i, d := range chunk {
			args[i] = d
			marks[i] = fmt.Sprintf("?%d", i+1)
		}
		rows, err := db.QueryContext(ctx, `SELECT did FROM users WHERE handle <> '' AND did IN (`+strings.Join(marks, ",")+`)`, args...)
		if err != nil {
			return nil, fmt.Errorf("read users: %w", err)
		}
		for rows.Next() {
			var d string
			if err := rows.Scan(&d); err != nil {
				rows.Close()
				return nil, fmt.Errorf("read users: %w", err)
			}
			known[d] = true
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("read users: %w", err)
		}
	}
	return known, nil
}
