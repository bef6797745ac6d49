package synth

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/jetstream"
)

// Options shapes a synthetic stream. Equal Options give byte-identical
// streams.
type Options struct {
	// Seed selects the stream.
	Seed uint64
	// Events is how many events to generate.
	Events int
	// Users is the number of distinct user DIDs (0: 40).
	Users int
	// Holds is the number of distinct hold DIDs (0: 4).
	Holds int
	// StartUS is the time_us of the first event (0: 1750000000000000).
	StartUS int64
}

func (o Options) withDefaults() Options {
	if o.Users <= 0 {
		o.Users = 40
	}
	if o.Holds <= 0 {
		o.Holds = 4
	}
	if o.StartUS <= 0 {
		o.StartUS = 1750000000000000
	}
	return o
}

// Collections of the stream (the processor's, plus noise).
const (
	colManifest = "io.atcr.manifest"
	colTag      = "io.atcr.tag"
	colStar     = "io.atcr.sailor.star"
	colProfile  = "io.atcr.sailor.profile"
	colRepoPage = "io.atcr.repo.page"
	colCaptain  = "io.atcr.hold.captain"
	colCrew     = "io.atcr.hold.crew"
	colStats    = "io.atcr.hold.stats"
)

// Bounds that keep the model's size independent of the stream length.
const (
	maxManifestsPerRepo = 4
	maxCrewPerHold      = 6
)

// Date-like names and values are here because real traffic has them (a
// tag per build day, a repository named after a release) and go-libsql
// returns TEXT that parses as a date as a time.Time: a read that does not
// go through database.Text changes them, and Diff then reports it.
var (
	repoNames = []string{"app", "api", "web", "worker", "cli", "db", "proxy", "base", "2024-06-01"}
	tagNames  = []string{"latest", "stable", "dev", "v1", "v2", "v3", "2024-06-01", "2024-06-01T12-00"}
	roles     = []string{"owner", "admin", "write", "read"}
	regions   = []string{"us-east", "eu-west", "ap-south"}
)

// Generator produces one stream event at a time while tracking the exact
// state the processor must end in. Call Next until it returns false, then
// Expected.
type Generator struct {
	o       Options
	rng     *rand.Rand
	t       int64
	emitted int
	m       *model
}

// NewGenerator returns a generator for o.
func NewGenerator(o Options) *Generator {
	o = o.withDefaults()
	return &Generator{
		o:   o,
		rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)),
		t:   o.StartUS,
		m:   newModel(),
	}
}

// Next returns the next event, or false when Options.Events were generated.
func (g *Generator) Next() (jetstream.Event, bool) {
	if g.emitted >= g.o.Events {
		return jetstream.Event{}, false
	}
	g.t += 1 + g.rng.Int64N(3000)
	for {
		if ev, ok := g.step(); ok {
			g.emitted++
			g.m.maxTimeUS = ev.TimeUS
			if ev.Kind != jetstream.KindCommit || strings.HasPrefix(ev.Commit.Collection, "io.atcr.") {
				g.m.lastUS = ev.TimeUS
			}
			return ev, true
		}
	}
}

// Expected is the state after every generated event (call after Next
// returned false; earlier it is the state so far).
func (g *Generator) Expected() *Expected { return g.m.expected(g.emitted) }

type action struct {
	weight int
	run    func(g *Generator) (jetstream.Event, bool)
}

var actions = []action{
	{20, (*Generator).pushManifest},
	{3, (*Generator).updateManifest},
	{5, (*Generator).deleteManifest},
	{15, (*Generator).setTag},
	{4, (*Generator).deleteTag},
	{6, (*Generator).star},
	{3, (*Generator).unstar},
	{15, (*Generator).holdStats},
	{1, (*Generator).deleteHoldStats},
	{3, (*Generator).profile},
	{1, (*Generator).deleteProfile},
	{3, (*Generator).repoPage},
	{1, (*Generator).deleteRepoPage},
	{1, (*Generator).captain},
	{2, (*Generator).addCrew},
	{1, (*Generator).removeCrew},
	{2, (*Generator).identity},
	{1, (*Generator).account},
	{5, (*Generator).noise},
	{2, (*Generator).invalid},
}

var totalWeight = func() int {
	n := 0
	for _, a := range actions {
		n += a.weight
	}
	return n
}()

func (g *Generator) step() (jetstream.Event, bool) {
	n := g.rng.IntN(totalWeight)
	for _, a := range actions {
		if n < a.weight {
			return a.run(g)
		}
		n -= a.weight
	}
	panic("unreachable")
}

// --- naming ---------------------------------------------------------------

func (g *Generator) userDID(i int) string { return fmt.Sprintf("did:plc:synthuser%05d", i) }
func (g *Generator) holdHost(i int) string {
	return fmt.Sprintf("hold%02d.synth.example", i)
}
func (g *Generator) holdDID(i int) string { return "did:web:" + g.holdHost(i) }

func (g *Generator) anyUser() string { return g.userDID(g.rng.IntN(g.o.Users)) }
func (g *Generator) anyHold() int    { return g.rng.IntN(g.o.Holds) }
func (g *Generator) anyRepo() string { return repoNames[g.rng.IntN(len(repoNames))] }

const tidAlphabet = "234567abcdefghijklmnopqrstuvwxyz"

// tid is an AT Protocol TID for the current time (13 base32-sortable chars).
func (g *Generator) tid() string { return tidOf(g.t, g.rng.IntN(1024)) }

// tidOf is the TID of time us (Unix µs) with clock identifier clock (0-1023).
func tidOf(us int64, clock int) string {
	v := uint64(us)<<10 | uint64(clock)
	var b [13]byte
	for i := 12; i >= 0; i-- {
		b[i] = tidAlphabet[v&31]
		v >>= 5
	}
	return string(b[:])
}

var rkeyEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// statsRKey is the io.atcr.hold.stats record key: base32(sha256(ownerDid + "/" + repository)[:16]).
func statsRKey(owner, repo string) string {
	sum := sha256.Sum256([]byte(owner + "/" + repo))
	return strings.ToLower(rkeyEncoding.EncodeToString(sum[:16]))
}

func (g *Generator) digest(kind string) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%d/%s/%d/%d", g.o.Seed, kind, g.t, g.rng.Uint64()))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func datetime(ms int64) string { return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z") }

func (g *Generator) ms() int64 { return g.t / 1000 }

// --- events ---------------------------------------------------------------

func (g *Generator) commit(did, op, collection, rkey string, record any) jetstream.Event {
	c := &jetstream.Commit{Rev: g.tid(), Operation: op, Collection: collection, RKey: rkey}
	if record != nil {
		raw, err := json.Marshal(record)
		if err != nil {
			panic(err) // records are built from plain maps
		}
		c.Record = raw
		c.CID = "bafyrei" + g.tid()
	}
	return jetstream.Event{DID: did, TimeUS: g.t, Kind: jetstream.KindCommit, Commit: c}
}

type obj = map[string]any

// --- the model ------------------------------------------------------------
