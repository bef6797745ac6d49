package processor

import (
	"errors"
	"fmt"
	"strings"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// op is one validated event, ready to apply.
type op struct {
	ev         *jetstream.Event
	did        string
	collection string // "" for identity and account events
	rkey       string
	cid        string
	delete     bool
	// version orders the commit against the rows of its record (see
	// version.go); "" for identity and account events.
	version string

	manifest *manifest
	tag      *tag
	star     *star
	profile  *profile
	page     *repoPage
	captain  *captain
	crew     *crew
	stats    *HoldStat
	identity *jetstream.Identity
	account  *jetstream.Account
}

// prepared is decode's verdict on one event, worked out before its batch
// was delivered (Prepare). op.ev is nil: the event is bound at use.
type prepared struct {
	op     *op
	reason string
	err    error
}

// Prepare decodes and validates ev ahead of its batch and leaves the
// result in ev.Prepared, where Apply finds it instead of decoding again.
// It reads only ev and touches no database, so it can run on any
// goroutine: the consumer runs it on the Jetstream reader's
// (jetstream.ClientOptions.Prepare), in parallel with the commit of the
// batches before. ev must not change afterwards.
func Prepare(ev *jetstream.Event) {
	o, reason, err := decode(ev)
	if o != nil {
		o.ev = nil
	}
	ev.Prepared = &prepared{op: o, reason: reason, err: err}
}

// preparedInvalid reports whether Prepare found ev invalid (it will be
// skipped: no users row comes of it, so its DID's handle is not looked
// up: a flood of invalid records from new DIDs must not become as many
// directory requests). false when ev was not prepared.
func preparedInvalid(ev *jetstream.Event) bool {
	p, ok := ev.Prepared.(*prepared)
	return ok && p.op == nil
}

// decodeEvent returns what Prepare worked out for ev, or decodes it now.
// The op is a copy bound to ev: a retried transaction applies the same
// events again from the same verdicts.
func decodeEvent(ev *jetstream.Event) (*op, string, error) {
	p, ok := ev.Prepared.(*prepared)
	if !ok {
		return decode(ev)
	}
	if p.op == nil {
		return nil, p.reason, p.err
	}
	o := *p.op
	o.ev = ev
	return &o, p.reason, p.err
}

// decode validates an event without touching the database. A non-empty
// reason means skip it (err says why, for the log).
func decode(ev *jetstream.Event) (*op, string, error) {
	if ev.TimeUS <= 0 {
		return nil, ReasonMalformedEvent, errors.New("time_us must be > 0")
	}
	o := &op{ev: ev, did: ev.DID}
	switch ev.Kind {
	case jetstream.KindIdentity:
		if ev.Identity == nil {
			return nil, ReasonMalformedEvent, errors.New("identity event without identity")
		}
		if o.did == "" {
			o.did = ev.Identity.DID
		}
		if d := ev.Identity.DID; d != "" && d != o.did {
			return nil, ReasonBadValue, fmt.Errorf("identity of %q in an event of %q", d, o.did)
		}
		if h := ev.Identity.Handle; h != "" && !validHandle(h) {
			return nil, ReasonBadValue, fmt.Errorf("handle %q is not a handle", h)
		}
		o.identity = ev.Identity
	case jetstream.KindAccount:
		if ev.Account == nil {
			return nil, ReasonMalformedEvent, errors.New("account event without account")
		}
		if ev.Account.Active == nil {
			return nil, ReasonMissingField, errors.New("account event without active")
		}
		if o.did == "" {
			o.did = ev.Account.DID
		}
		if d := ev.Account.DID; d != "" && d != o.did {
			return nil, ReasonBadValue, fmt.Errorf("account of %q in an event of %q", d, o.did)
		}
		if s := ev.Account.Status; !validKey(s) || len(s) > maxAccountStatusLen {
			return nil, ReasonBadValue, fmt.Errorf("account status %q is not a status", s)
		}
		o.account = ev.Account
	case jetstream.KindCommit:
		return decodeCommit(o)
	default:
		return nil, ReasonMalformedEvent, errors.New("unknown kind " + ev.Kind)
	}
	if reason, err := checkDID(o.did); err != nil {
		return nil, reason, err
	}
	return o, "", nil
}

// checkDID checks the event's repo DID: missing makes the event unusable,
// present but not DID syntax (a NUL, invalid UTF-8, a stray character) is
// a bad value.
func checkDID(did string) (string, error) {
	switch {
	case did == "":
		return ReasonMalformedEvent, errors.New("no did")
	case !validDID(did):
		return ReasonBadValue, fmt.Errorf("did %q is not a DID", did)
	}
	return "", nil
}

// validHandle reports whether s is a handle by the AT Protocol syntax
// (atproto.com/specs/handle: a DNS name of two labels at least, 253 bytes
// at most, the last label not starting with a digit).
func validHandle(s string) bool {
	_, err := syntax.ParseHandle(s)
	return err == nil
}

func decodeCommit(o *op) (*op, string, error) {
	c := o.ev.Commit
	if c == nil {
		return nil, ReasonMalformedEvent, errors.New("commit event without commit")
	}
	if !strings.HasPrefix(c.Collection, "io.atcr.") {
		return nil, ReasonNotATCR, nil
	}
	if !knownCollection(c.Collection) {
		return nil, ReasonUnknownCollection, errors.New("collection " + c.Collection)
	}
	if reason, err := checkDID(o.did); err != nil {
		return nil, reason, err
	}
	if c.RKey == "" {
		return nil, ReasonMalformedEvent, errors.New("commit without rkey")
	}
	if !validRKey(c.RKey) {
		return nil, ReasonBadValue, fmt.Errorf("rkey %q is not a record key", c.RKey)
	}
	o.collection, o.rkey, o.cid = c.Collection, c.RKey, c.CID
	var err error
	if o.version, err = versionOf(o.ev); err != nil {
		return nil, ReasonBadValue, err
	}
	switch c.Operation {
	case jetstream.OpDelete:
		o.delete = true
		return o, "", nil
	case jetstream.OpCreate, jetstream.OpUpdate:
	default:
		return nil, ReasonMalformedEvent, errors.New("unknown operation " + c.Operation)
	}
	if len(c.Record) == 0 || string(c.Record) == "null" {
		return nil, ReasonMissingField, errors.New("create/update without record")
	}
	if c.CID != "" {
		// Stored with the manifest (manifests.cid): a CID, or a bad value.
		if _, err := syntax.ParseCID(c.CID); err != nil {
			return nil, ReasonBadValue, fmt.Errorf("cid %q is not a CID", c.CID)
		}
	}
	switch c.Collection {
	case CollectionManifest:
		o.manifest, err = decodeManifest(c.Record)
	case CollectionTag:
		o.tag, err = decodeTag(c.Record)
	case CollectionStar:
		o.star, err = decodeStar(c.Record)
	case CollectionProfile:
		o.profile, err = decodeProfile(c.RKey, c.Record)
	case CollectionRepoPage:
		o.page, err = decodeRepoPage(c.Record)
	case CollectionCaptain:
		o.captain, err = decodeCaptain(c.RKey, c.Record)
	case CollectionCrew:
		o.crew, err = decodeCrew(c.Record)
	case CollectionStats:
		o.stats, err = decodeStats(c.Record)
		if err == nil {
			o.stats.HoldDID, o.stats.RKey, o.stats.SourceUS, o.stats.Version = o.did, c.RKey, o.ev.TimeUS, o.version
		}
	}
	if err != nil {
		return nil, reasonOf(err), err
	}
	return o, "", nil
}

// maxAccountStatusLen bounds an #account status (a known value such as
// takendown or deactivated; the field is open, so others are stored).
const maxAccountStatusLen = 128
