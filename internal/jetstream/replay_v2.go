package jetstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// The replay server's v2 wire: a capture whose every line carries a
// sequence number is also served on PathV2 as proposal-0015 frames
// ({"$type":"message","payload":{"$type":"…#commit","seq":N,…}}), with
// the collections filter and a seq or time cursor, compressed with
// zstdDictionary=<id> when asked, the dictionary served on
// PathZstdDictionary (the v1 one: to a v2 client any zstd dictionary
// is the host's own). So a consumer pointed at it runs the v2 wire end to
// end and stores the same sequence positions as on /subscribe.

// v2Copy is a replayEvent as a v2 frame, built the first time it is sent
// (then compressed, the first time a compressed subscription sends it).
type v2Copy struct {
	once, zonce     sync.Once
	raw, compressed []byte
}

// handleSubscribeV2 serves PathV2. A capture without sequence numbers is
// refused (a v2 server numbers every event), as is a dictionary other
// than the one handleDictionary serves.
func (s *ReplayServer) handleSubscribeV2(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !s.numbered {
		xrpcError(w, http.StatusBadRequest, "InvalidRequest",
			"this capture's events carry no sequence number (\"cursor\"): it is served on /subscribe only")
		return
	}
	sub := subscription{wire: WireV2, collections: q["collections"]}
	if id := q.Get("zstdDictionary"); id != "" {
		if id != strconv.FormatUint(uint64(DictionaryID), 10) {
			xrpcError(w, http.StatusBadRequest, ErrNameUnknownZstdDictionary, fmt.Sprintf("unknown zstd dictionary %q", id))
			return
		}
		sub.compress = true
	}
	s.subscribe(w, r, sub)
}

// handleDictionary serves PathZstdDictionary: the dictionary the v2 path
// compresses with.
func handleDictionary(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(dictionary)
}

// xrpcError answers a request with an XRPC error body, as a v2 server
// refuses a subscription before the upgrade.
func xrpcError(w http.ResponseWriter, status int, name, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": name, "message": message})
}

// v2Frame is e as a v2 frame payload (compressed: a binary frame's).
func (e *replayEvent) v2Frame(compress bool) []byte {
	e.v2.once.Do(func() { e.v2.raw = v2Message(e.raw) })
	if !compress {
		return e.v2.raw
	}
	e.v2.zonce.Do(func() { e.v2.compressed = Compress(nil, e.v2.raw) })
	return e.v2.compressed
}

// v2Message converts a legacy event line, which loadCapture decoded
// before, into the v2 frame carrying the same event: its "cursor" as
// "seq", its time_us as "time" (RFC 3339, microseconds: exact), the
// commit's members at the payload's top level, the record as captured.
func v2Message(line []byte) []byte {
	ev, err := Decode(line)
	if err != nil {
		// loadCapture kept only lines that decode.
		panic(fmt.Sprintf("jetstream replay: a loaded event no longer decodes: %v", err))
	}
	p := map[string]any{
		"$type": v2Prefix + ev.Kind,
		"seq":   ev.Seq,
		"did":   ev.DID,
		"time":  time.UnixMicro(ev.TimeUS).UTC().Format("2006-01-02T15:04:05.000000Z"),
	}
	switch ev.Kind {
	case KindCommit:
		c := ev.Commit
		p["rev"], p["operation"], p["collection"], p["rkey"] = c.Rev, c.Operation, c.Collection, c.RKey
		if c.CID != "" {
			p["cid"] = c.CID
		}
		if len(c.Record) > 0 {
			p["record"] = c.Record
		}
	case KindIdentity:
		p["identity"] = ev.Identity
	case KindAccount:
		p["account"] = ev.Account
	case KindSync:
		p["sync"] = ev.Sync
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the record's strings stay as captured
	if err := enc.Encode(map[string]any{"$type": "message", "payload": p}); err != nil {
		panic(fmt.Sprintf("jetstream replay: encode a v2 frame: %v", err))
	}
	return bytes.TrimRight(b.Bytes(), "\n")
}
