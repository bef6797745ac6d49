package jetstream

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"
)

// FuzzDecode feeds arbitrary frames, text and binary, to the decoder. Seeds
// are every captured event, raw and compressed; `go test` runs just the
// seeds, `go test -fuzz=FuzzDecode` explores from them.
//
// Properties: Decode never panics; a failure is a *DecodeError of a known
// class; a success satisfies Validate's promises and survives a re-encode
// (raw and compressed) unchanged.
func FuzzDecode(f *testing.F) {
	for _, name := range captures {
		for _, line := range captureLines(f, name) {
			f.Add(line, false)
			f.Add(Compress(nil, line), true)
		}
	}
	d := newTestDecoder(f, 64<<10)
	f.Fuzz(func(t *testing.T, frame []byte, compressed bool) {
		ev, err := d.Decode(frame, compressed)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) || !slices.Contains(ErrorClasses, de.Class) {
				t.Fatalf("error %v (%T) is not a classified *DecodeError", err, err)
			}
			return
		}
		switch {
		case !validDID(ev.DID), ev.TimeUS <= 0:
			t.Fatalf("accepted an event without DID or time: %+v", ev)
		case ev.Kind == KindCommit && (ev.Commit == nil || ev.Identity != nil || ev.Account != nil),
			ev.Kind == KindIdentity && (ev.Identity == nil || ev.Commit != nil || ev.Account != nil),
			ev.Kind == KindAccount && (ev.Account == nil || ev.Commit != nil || ev.Identity != nil):
			t.Fatalf("accepted an event whose sub-objects do not match its kind: %+v", ev)
		case ev.Commit != nil && (ev.Commit.Collection == "" || ev.Commit.RKey == ""):
			t.Fatalf("accepted an incomplete commit: %+v", ev.Commit)
		}
		again, err := json.Marshal(ev)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", ev, err)
		}
		for _, c := range []bool{false, true} {
			wire := again
			if c {
				wire = Compress(nil, again)
			}
			back, err := d.Decode(wire, c)
			if err != nil {
				t.Fatalf("re-encoded event (compressed=%v) no longer decodes: %v\n%s", c, err, again)
			}
			if !reflect.DeepEqual(normalized(ev), normalized(back)) {
				t.Fatalf("re-encode changed the event:\n%+v\n%+v", ev, back)
			}
		}
	})
}

// normalized re-compacts the raw record so two encodings of one record
// compare equal (json.Marshal compacts RawMessage; the input may not be).
func normalized(ev Event) Event {
	if ev.Commit != nil && ev.Commit.Record != nil {
		c := *ev.Commit
		if b, err := json.Marshal(c.Record); err == nil {
			c.Record = b
		}
		ev.Commit = &c
	}
	return ev
}
