package processor

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/database"
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
	// refreshMargin is how much older than the start of a DID's last
	// refresh an #identity event must be for that refresh to answer it
	// (refreshCovered): it absorbs the Jetstream host's clock running
	// behind ours and the directory's lag in publishing a change.
	refreshMargin = time.Minute
	// refreshFailedFor is how long a failed refresh still answers the
	// #identity events older than it (refreshCovered): during a directory
	// outage each account is tried once a minute, not once a batch (the
	// resolver caches a failed lookup as long).
	refreshFailedFor = time.Minute
	// usersInChunk bounds the DIDs of one IN (...) list (SQLite's variable
	// limit is far above it).
	usersInChunk = 500
)

type (
	handlesKey   struct{}
	endpointsKey struct{}
)

// verifiedHandles is what PrepareBatch found: DID → verified handle ("" =
// none verifies, which clears users.handle).
type verifiedHandles map[string]string

// endpoints are the PDS endpoints the DID documents PrepareBatch read
// name: DID → base URL.
type endpoints map[string]string

func handlesFrom(ctx context.Context) verifiedHandles {
	h, _ := ctx.Value(handlesKey{}).(verifiedHandles)
	return h
}

func endpointsFrom(ctx context.Context) endpoints {
	e, _ := ctx.Value(endpointsKey{}).(endpoints)
	return e
}

// EndpointResolver is a HandleResolver that also tells which PDS a DID
// document names (*identity.Resolver: from the document its handle lookup
// just read, so no request more). PrepareBatch records it with the
// handles, so an #identity event that moves an account to another PDS is
// seen (users.pds).
type EndpointResolver interface {
	PDSEndpoint(ctx context.Context, did string) (string, error)
}

// PrepareBatch resolves the handles a batch needs, before its transaction
// opens (the lookups are network requests and must not hold the
// database's write lock), and returns ctx carrying them for ApplyTx:
//
//   - for every #identity event, the DID's cached identity is purged and
//     its handle verified afresh (AT Protocol: an #identity event means
//     the DID document or handle may have changed; Bluesky's relay sends
//     it without a handle, so the event's own handle is not relied on).
//     Jetstream delivers #identity events of every account on the network
//     whatever the collection filter (jetstream filter.go: DID-level events
//     bypass wantedCollections), and the first event of a DID the index
//     has no users row of is kept (a row, users.go), so each is looked up,
//     unless already covered by an earlier refresh of the same DID (see
//     refreshCovered): catching up on history, one lookup answers for
//     every older event;
//   - for every DID with a record or an #account event in the batch and no
//     users row yet, or with a record and a row without a handle (an
//     earlier lookup failed), its handle is verified, so a new row starts
//     with its handle and a missing one is filled in once it verifies.
//
// With a resolver that is also an EndpointResolver, the PDS endpoint of
// every DID looked up is recorded too (a new row's users.pds, and what an
// #identity event is compared with).
//
// A lookup that fails (network, directory down) leaves that DID out: the
// row keeps what it had (the event's own handle is never used).
// With no resolver configured it returns ctx unchanged; with db nil (or
// the users read failing) it looks up no new user's handle and refreshes
// only the #identity DIDs.
func (p *Processor) PrepareBatch(ctx context.Context, db *database.DB, events []jetstream.Event) context.Context {
	if p.handles == nil {
		return ctx
	}
	// identityUS is each #identity event's DID and the time_us of its
	// newest #identity event in the batch.
	identityUS := map[string]int64{}
	var identityDIDs, commitDIDs, accountDIDs []string
	seen, accountSeen := map[string]bool{}, map[string]bool{}
	for i := range events {
		ev := &events[i]
		switch {
		case ev.Kind == jetstream.KindIdentity && ev.DID != "":
			if _, ok := identityUS[ev.DID]; !ok {
				identityDIDs = append(identityDIDs, ev.DID)
			}
			identityUS[ev.DID] = max(identityUS[ev.DID], ev.TimeUS)
		case ev.Kind == jetstream.KindAccount && ev.DID != "" && !accountSeen[ev.DID] && !preparedInvalid(ev):
			accountSeen[ev.DID] = true
			accountDIDs = append(accountDIDs, ev.DID)
		case ev.Kind == jetstream.KindCommit && ev.Commit != nil && ev.DID != "" && !seen[ev.DID] &&
			strings.HasPrefix(ev.Commit.Collection, "io.atcr.") && ev.Commit.Operation != jetstream.OpDelete &&
			!preparedInvalid(ev):
			seen[ev.DID] = true
			commitDIDs = append(commitDIDs, ev.DID)
		}
	}
	refresh := map[string]bool{}
	for _, d := range identityDIDs {
		if !p.refreshCovered(d, identityUS[d]) {
			refresh[d] = true
		}
	}
	// Which DIDs the database must tell about: commit DIDs not known to
	// have a handle, and #account DIDs not known to have a row, neither
	// refreshed anyway.
	var ask []string
	for _, d := range p.notKnown(commitDIDs) {
		if !refresh[d] {
			ask = append(ask, d)
		}
	}
	for _, d := range p.notKnown(accountDIDs) {
		if !refresh[d] && !seen[d] {
			ask = append(ask, d)
		}
	}
	var unknown []string
	if db != nil && len(ask) > 0 {
		rows, err := knownUsers(ctx, db, ask)
		if err != nil {
			// Without the answer no new user's handle is looked up, and
			// only the refreshes are made.
			p.lookups.Warn().Err(err).Msg("read users before resolving handles")
			ask = nil
		}
		for _, d := range ask {
			hasHandle, hasRow := rows[d]
			switch {
			case hasHandle:
				p.remember(d)
			case !hasRow || seen[d]:
				// No row (a record's or an #account event's DID), or a
				// record's row without a handle.
				unknown = append(unknown, d)
			}
		}
	}
	if len(refresh) == 0 && len(unknown) == 0 {
		return ctx
	}
	out, pds := p.lookUp(ctx, refresh, unknown)
	ctx = context.WithValue(ctx, handlesKey{}, out)
	return context.WithValue(ctx, endpointsKey{}, pds)
}

// lookUp refreshes the handles of the DIDs in refresh and looks up those
// of unknown, at most handleLookups at once and handleBatchBudget in all,
// and with an EndpointResolver each one's PDS endpoint.
func (p *Processor) lookUp(ctx context.Context, refresh map[string]bool, unknown []string) (verifiedHandles, endpoints) {
	out, pds := verifiedHandles{}, endpoints{}
	er, _ := p.handles.(EndpointResolver)
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
			p.lookups.Warn().Err(err).Str("did", did).Msg("handle not verified; keeping what the users row has")
			return
		}
		var endpoint string
		if er != nil {
			endpoint, _ = er.PDSEndpoint(bctx, did) // the document the lookup just read
		}
		mu.Lock()
		out[did] = h
		if endpoint != "" {
			pds[did] = endpoint
		}
		mu.Unlock()
	}
	for did := range refresh {
		wg.Add(1)
		go lookup(did, func(ctx context.Context, did string) (string, error) {
			at := time.Now()
			h, err := p.handles.RefreshHandle(ctx, did)
			p.refreshed(did, at, err == nil)
			return h, err
		})
	}
	for _, did := range unknown {
		wg.Add(1)
		go lookup(did, p.handles.Handle)
	}
	wg.Wait()
	return out, pds
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

// knownUsers returns, for each of dids that has a users row, whether the
// row has a handle (true) or not (false: its first lookup failed,
// directory down or timeout). A DID without a handle is not known, so a
// later batch with a record of that DID verifies its handle again (the
// resolver caches a failure for a while, so this costs at most one lookup
// per DID per failure TTL) and ensureUser fills it in.
func knownUsers(ctx context.Context, db *database.DB, dids []string) (map[string]bool, error) {
	known := map[string]bool{}
	for start := 0; start < len(dids); start += usersInChunk {
		chunk := dids[start:min(start+usersInChunk, len(dids))]
		args := make([]any, len(chunk))
		marks := make([]string, len(chunk))
		for i, d := range chunk {
			args[i] = d
			marks[i] = fmt.Sprintf("?%d", i+1)
		}
		rows, err := db.QueryContext(ctx, `SELECT did, COALESCE(handle, '') <> '' FROM users WHERE did IN (`+strings.Join(marks, ",")+`)`, args...)
		if err != nil {
			return nil, fmt.Errorf("read users: %w", err)
		}
		for rows.Next() {
			var (
				d         string
				hasHandle bool
			)
			if err := rows.Scan(&d, &hasHandle); err != nil {
				rows.Close()
				return nil, fmt.Errorf("read users: %w", err)
			}
			known[d] = hasHandle
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("read users: %w", err)
		}
	}
	return known, nil
}

// refreshMark is when the last refresh of a DID's handle started and
// whether it succeeded.
type refreshMark struct {
	at time.Time
	ok bool
}

// refreshed notes a refresh of did's handle that started at at.
func (p *Processor) refreshed(did string, at time.Time, ok bool) {
	p.knownMu.Lock()
	defer p.knownMu.Unlock()
	if p.refreshes == nil || len(p.refreshes) >= knownUsersMax {
		p.refreshes = map[string]refreshMark{}
	}
	if m, seen := p.refreshes[did]; !seen || !m.at.After(at) {
		p.refreshes[did] = refreshMark{at: at, ok: ok}
	}
}

// refreshCovered reports whether an earlier refresh of did's handle
// answers an #identity event at eventUS (its time_us, Unix microseconds):
// the refresh read the directory after the change the event announces
// (it started more than refreshMargin after the event), and it succeeded
// or failed less than refreshFailedFor ago. A live event is always newer
// than that and gets its own refresh; events replayed from the past (a
// catch-up, a cursor rewind) are answered by the first one.
func (p *Processor) refreshCovered(did string, eventUS int64) bool {
	p.knownMu.Lock()
	m, seen := p.refreshes[did]
	p.knownMu.Unlock()
	if !seen || !time.UnixMicro(eventUS).Before(m.at.Add(-refreshMargin)) {
		return false
	}
	return m.ok || time.Since(m.at) < refreshFailedFor
}
