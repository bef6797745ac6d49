package jetstream

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// captures are the real Jetstream v1 fixtures (see testdata/README.md).
var captures = []string{"expected_v1.jsonl", "golden_v1.jsonl"}

// captureLines returns the lines of testdata/name, each without its newline.
func captureLines(tb testing.TB, name string) [][]byte {
	tb.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var lines [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, append([]byte(nil), sc.Bytes()...))
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return lines
}

// captureEvents decodes every line of testdata/name.
func captureEvents(tb testing.TB, name string) []Event {
	tb.Helper()
	var evs []Event
	for i, line := range captureLines(tb, name) {
		ev, err := Decode(line)
		if err != nil {
			tb.Fatalf("%s:%d: %v", name, i+1, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func newTestDecoder(tb testing.TB, max int64) *Decoder {
	tb.Helper()
	d, err := NewDecoder(max)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(d.Close)
	return d
}

// asJSONValue unmarshals into generic values so two encodings of the same
// object compare equal regardless of key order.
func asJSONValue(tb testing.TB, b []byte) any {
	tb.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		tb.Fatalf("unmarshal %s: %v", b, err)
	}
	return v
}

func TestEmbeddedDictionaryIsJetstreamsLegacySubscribeDictionary(t *testing.T) {
	info, err := zstd.InspectDictionary(dictionary)
	if err != nil {
		t.Fatal(err)
	}
	if info.ID() != DictionaryID {
		t.Fatalf("dictionary ID %d, want %d", info.ID(), DictionaryID)
	}
	if len(dictionary) != 112640 {
		t.Fatalf("dictionary is %d bytes, want 112640", len(dictionary))
	}
}

func TestEveryCapturedEventDecodesRawAndCompressedToIdenticalEvents(t *testing.T) {
	d := newTestDecoder(t, 0)
	for _, name := range captures {
		lines := captureLines(t, name)
		if len(lines) == 0 {
			t.Fatalf("%s is empty", name)
		}
		for i, line := range lines {
			raw, err := d.Decode(line, false)
			if err != nil {
				t.Fatalf("%s:%d raw: %v", name, i+1, err)
			}
			frame := Compress(nil, line)
			if bytes.Contains(frame, []byte(`"did"`)) {
				t.Fatalf("%s:%d: compressed frame still holds plain JSON keys", name, i+1)
			}
			hdr := zstd.Header{}
			if err := hdr.Decode(frame); err != nil || hdr.DictionaryID != DictionaryID {
				t.Fatalf("%s:%d: frame header dictionary %d (%v), want %d", name, i+1, hdr.DictionaryID, err, DictionaryID)
			}
			comp, err := d.Decode(frame, true)
			if err != nil {
				t.Fatalf("%s:%d compressed: %v", name, i+1, err)
			}
			if !reflect.DeepEqual(raw, comp) {
				t.Fatalf("%s:%d: raw and compressed decode differ:\n%+v\n%+v", name, i+1, raw, comp)
			}
			// The wire types must not lose anything the capture carries.
			back, err := json.Marshal(raw)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(asJSONValue(t, line), asJSONValue(t, back)) {
				t.Fatalf("%s:%d: re-encoded event differs from the capture:\n%s\n%s", name, i+1, line, back)
			}
		}
	}
}

func TestCapturedKindsAndOperationsAreCountedAsTheManifestSays(t *testing.T) {
	counts := map[string]int{}
	for _, ev := range captureEvents(t, "expected_v1.jsonl") {
		counts[ev.Kind]++
		if ev.Commit != nil {
			counts[ev.Commit.Operation]++
		}
	}
	want := map[string]int{"commit": 150, "identity": 1, "account": 1, "create": 144, "update": 2, "delete": 4}
	if !reflect.DeepEqual(counts, want) {
		t.Fatalf("counts %v, want %v", counts, want)
	}
}

func TestDecodeRejectsBadFramesWithTheirClass(t *testing.T) {
	valid := `{"did":"did:plc:abc","time_us":1700000000000000,"kind":"commit","commit":{"rev":"r","operation":"create","collection":"io.atcr.tag","rkey":"k","record":{"a":1},"cid":"c"}}`
	cases := []struct {
		name  string
		frame string
		class ErrorClass
	}{
		{"not json", `{"did":`, ClassMalformedJSON},
		{"trailing garbage", valid + `x`, ClassMalformedJSON},
		{"array", `[1,2]`, ClassMalformedJSON},
		// null is not an event (it decoded to a zero event, reported as a
		// DID "" that is not a DID).
		{"null", `null`, ClassMalformedJSON},
		{"null with spaces", " null \n", ClassMalformedJSON},
		{"time_us as string", `{"did":"did:plc:abc","time_us":"1","kind":"identity","identity":{}}`, ClassMalformedJSON},
		{"time_us as float", `{"did":"did:plc:abc","time_us":1.5,"kind":"identity","identity":{}}`, ClassMalformedJSON},
		{"empty object", `{}`, ClassInvalidEvent},
		{"no did", `{"time_us":1,"kind":"identity","identity":{}}`, ClassInvalidEvent},
		{"did without method", `{"did":"did:abc","time_us":1,"kind":"identity","identity":{}}`, ClassInvalidEvent},
		{"zero time", `{"did":"did:plc:abc","time_us":0,"kind":"identity","identity":{}}`, ClassInvalidEvent},
		{"negative time", `{"did":"did:plc:abc","time_us":-5,"kind":"identity","identity":{}}`, ClassInvalidEvent},
		{"unknown kind", `{"did":"did:plc:abc","time_us":1,"kind":"sync"}`, ClassInvalidEvent},
		{"identity without body", `{"did":"did:plc:abc","time_us":1,"kind":"identity"}`, ClassInvalidEvent},
		{"account without body", `{"did":"did:plc:abc","time_us":1,"kind":"account"}`, ClassInvalidEvent},
		{"commit without body", `{"did":"did:plc:abc","time_us":1,"kind":"commit"}`, ClassInvalidEvent},
		// active is required in #account: read as false, it hid a live
		// account.
		{"account without active", `{"did":"did:plc:abc","time_us":1700000000000000,"kind":"account","account":{"did":"did:plc:abc","seq":1}}`, ClassInvalidEvent},
		{"account active under Active", `{"did":"did:plc:abc","time_us":1700000000000000,"kind":"account","account":{"Active":true,"did":"did:plc:abc","seq":1}}`, ClassInvalidEvent},
		{"account active as string", `{"did":"did:plc:abc","time_us":1700000000000000,"kind":"account","account":{"active":"true","did":"did:plc:abc","seq":1}}`, ClassMalformedJSON},
		{"commit bad operation", strings.Replace(valid, `"create"`, `"upsert"`, 1), ClassInvalidEvent},
		{"commit no collection", strings.Replace(valid, `"io.atcr.tag"`, `""`, 1), ClassInvalidEvent},
		{"commit no rkey", strings.Replace(valid, `"rkey":"k"`, `"rkey":""`, 1), ClassInvalidEvent},
		{"create without record", strings.Replace(valid, `"record":{"a":1},`, ``, 1), ClassInvalidEvent},
		{"update with null record", strings.Replace(strings.Replace(valid, `{"a":1}`, `null`, 1), "create", "update", 1), ClassInvalidEvent},
		// Member names match exactly and once (internal/atproto):
		// encoding/json read "DID" as did and kept the last duplicate.
		{"did under DID", strings.Replace(valid, `"did"`, `"DID"`, 1), ClassInvalidEvent},
		{"operation under Operation", strings.Replace(valid, `"operation"`, `"Operation"`, 1), ClassInvalidEvent},
		{"did twice", strings.Replace(valid, `"did":"did:plc:abc"`, `"did":"did:plc:abc","did":"did:plc:xyz"`, 1), ClassMalformedJSON},
		{"collection twice", strings.Replace(valid, `"collection":"io.atcr.tag"`, `"collection":"io.atcr.tag","collection":"io.atcr.manifest"`, 1), ClassMalformedJSON},
		{"record member twice", strings.Replace(valid, `{"a":1}`, `{"a":1,"a":2}`, 1), ClassMalformedJSON},
		{"invalid UTF-8", strings.Replace(valid, `"rkey":"k"`, "\"rkey\":\"k\xff\"", 1), ClassMalformedJSON},
	}
	d := newTestDecoder(t, 0)
	if _, err := d.Decode([]byte(valid), false); err != nil {
		t.Fatalf("the valid base case fails: %v", err)
	}
	for _, active := range []string{"true", "false"} {
		ev, err := d.Decode([]byte(`{"did":"did:plc:abc","time_us":1700000000000000,"kind":"account","account":{"active":`+active+`,"did":"did:plc:abc","seq":1}}`), false)
		if err != nil || ev.Account.Active == nil || fmt.Sprint(*ev.Account.Active) != active {
			t.Fatalf("an account with active %s: %+v, %v", active, ev.Account, err)
		}
	}
	for _, tc := range cases {
		for _, compressed := range []bool{false, true} {
			frame := []byte(tc.frame)
			if compressed {
				frame = Compress(nil, frame)
			}
			_, err := d.Decode(frame, compressed)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("%s (compressed=%v): error %v is not a *DecodeError", tc.name, compressed, err)
			}
			if de.Class != tc.class || ClassOf(err) != tc.class {
				t.Errorf("%s (compressed=%v): class %q, want %q (%v)", tc.name, compressed, de.Class, tc.class, err)
			}
			if de.Size != int64(len(frame)) {
				t.Errorf("%s (compressed=%v): size %d, want the frame's %d", tc.name, compressed, de.Size, len(frame))
			}
		}
	}
}

func TestInvalidEventErrorCarriesItsTimeUS(t *testing.T) {
	_, err := Decode([]byte(`{"did":"","time_us":1783175888085434,"kind":"commit"}`))
	var de *DecodeError
	if !errors.As(err, &de) || de.TimeUS != 1783175888085434 {
		t.Fatalf("got %v (%+v), want an invalid_event carrying time_us", err, de)
	}
}

func TestDecodeIgnoresUnknownFieldsAndClearsSubObjectsOfOtherKinds(t *testing.T) {
	ev, err := Decode([]byte(`{"did":"did:plc:abc","time_us":1783175888085434,"kind":"identity","future":{"x":[1]},` +
		`"identity":{"did":"did:plc:abc","seq":3,"time":"t","newField":true},"account":{"active":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Identity == nil || ev.Identity.Seq != 3 || ev.Account != nil || ev.Commit != nil {
		t.Fatalf("got %+v", ev)
	}
	if ev.Collection() != "" {
		t.Fatalf("identity event has collection %q", ev.Collection())
	}
}

func TestBinaryFramesThatAreNotDictionaryZstdAreBadZstd(t *testing.T) {
	d := newTestDecoder(t, 0)
	line := captureLines(t, "golden_v1.jsonl")[0]
	frame := Compress(nil, line)
	plain, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := zstd.NewWriter(nil, zstd.WithEncoderDictRaw(42, line))
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"unknown dictionary":  other.EncodeAll(line, nil),
		"json sent as binary": line,
		"truncated":           frame[:len(frame)/2],
		"corrupted":           append(append([]byte(nil), frame[:12]...), bytes.Repeat([]byte{0xff}, len(frame)-12)...),
		"empty":               {},
	}
	for name, frame := range cases {
		if _, err := d.Decode(frame, true); ClassOf(err) != ClassBadZstd {
			t.Errorf("%s: got %v, want bad_zstd", name, err)
		}
	}
	// A dictionary-less zstd frame is still a valid zstd frame carrying JSON.
	if _, err := d.Decode(plain.EncodeAll(line, nil), true); err != nil {
		t.Errorf("plain zstd frame: %v", err)
	}
}

func TestFramesOverTheLimitAreOversizedBeforeAndAfterDecompression(t *testing.T) {
	d := newTestDecoder(t, 4096)
	big := []byte(`{"did":"did:plc:abc","time_us":1,"kind":"commit","commit":{"operation":"create","collection":"a.b.c","rkey":"k","record":{"t":"` +
		strings.Repeat("a", 1<<20) + `"}}}`)
	if _, err := d.Decode(big, false); ClassOf(err) != ClassOversized {
		t.Fatalf("raw: got %v, want oversized", err)
	}
	small := Compress(nil, big) // a megabyte of one letter compresses to a few hundred bytes
	if len(small) > 4096 {
		t.Fatalf("test frame did not compress: %d bytes", len(small))
	}
	if _, err := d.Decode(small, true); ClassOf(err) != ClassOversized {
		t.Fatalf("compressed bomb: got %v, want oversized", err)
	}
	// A streamed frame carries no content size, only a window larger than
	// the limit: zstd refuses it by window size (found from outside: a
	// 70 MB event counted as bad_zstd).
	var streamed bytes.Buffer
	zw, err := zstd.NewWriter(&streamed, zstd.WithWindowSize(1<<20), zstd.WithEncoderDict(dictionary))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(big); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Decode(streamed.Bytes(), true); ClassOf(err) != ClassOversized {
		t.Fatalf("streamed frame with a window above the limit: got %v, want oversized", err)
	}
	if d.MaxEventBytes() != 4096 {
		t.Fatalf("MaxEventBytes %d", d.MaxEventBytes())
	}
	if newTestDecoder(t, 0).MaxEventBytes() != DefaultMaxEventBytes {
		t.Fatal("a zero limit does not default")
	}
}
