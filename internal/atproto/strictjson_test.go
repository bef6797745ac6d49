package atproto_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/atproto"
)

type rec struct {
	Tag    *string         `json:"tag"`
	Digest string          `json:"digest"`
	Raw    json.RawMessage `json:"raw"`
	Inner  struct {
		Size int64 `json:"size"`
	} `json:"inner"`
	Embedded
}

type Embedded struct {
	MediaType string `json:"mediaType"`
}

// The three places encoding/json reads network JSON differently from the
// AT Protocol data model, each checked against encoding/json so the test
// shows the difference it exists for.
func TestNamesAreCaseSensitiveUniqueAndUTF8(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		wantErr  string // "" when it decodes
		check    func(t *testing.T, r rec)
	}{
		{name: "a case variant is an unknown member", in: `{"TAG":"latest","Digest":"x"}`, check: func(t *testing.T, r rec) {
			if r.Tag != nil || r.Digest != "" {
				t.Errorf("case variants read as fields: %+v", r)
			}
		}},
		{name: "a duplicated name is refused", in: `{"tag":"a","tag":"b"}`, wantErr: "duplicate"},
		{name: "a duplicated name in a nested object is refused", in: `{"inner":{"size":1,"size":2}}`, wantErr: "duplicate"},
		{name: "invalid UTF-8 is refused", in: "{\"tag\":\"\xff\"}", wantErr: "UTF-8"},
		{name: "trailing data is refused", in: `{"tag":"a"} {}`, wantErr: "invalid"},
		{name: "unknown members are ignored, known ones read", in: `{"tag":"v1","digest":"d","extra":[1,{"a":2}],"raw":{"k":[1]},"inner":{"size":7},"mediaType":"m"}`,
			check: func(t *testing.T, r rec) {
				if r.Tag == nil || *r.Tag != "v1" || r.Digest != "d" || string(r.Raw) != `{"k":[1]}` || r.Inner.Size != 7 || r.MediaType != "m" {
					t.Errorf("decoded %+v", r)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r rec
			err := atproto.Unmarshal([]byte(tc.in), &r)
			var r2 rec
			errRead := atproto.UnmarshalRead(strings.NewReader(tc.in), &r2)
			if (err == nil) != (errRead == nil) {
				t.Fatalf("Unmarshal %v, UnmarshalRead %v: want the same outcome", err, errRead)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, r)
			tc.check(t, r2)
		})
	}
	// What the package exists for: encoding/json reads both differently.
	var v1 rec
	if err := json.Unmarshal([]byte(`{"TAG":"latest","digest":"a","digest":"b"}`), &v1); err != nil || v1.Tag == nil || v1.Digest != "b" {
		t.Fatalf("encoding/json no longer folds case or keeps the last duplicate (%+v, %v): revisit this package", v1, err)
	}
}

// A document that is null where an object is decoded is an error, not a
// zero struct; null stays a value where one is allowed (any, a map, a
// pointer).
func TestANullDocumentIsNotAnObject(t *testing.T) {
	type obj struct {
		A string `json:"a"`
	}
	for _, doc := range []string{"null", " null\n", "\tnull\r\n"} {
		var o obj
		if err := atproto.Unmarshal([]byte(doc), &o); !errors.Is(err, atproto.ErrNull) {
			t.Errorf("atproto.Unmarshal(%q) into a struct: %v, want atproto.ErrNull", doc, err)
		}
		if err := atproto.UnmarshalRead(strings.NewReader(doc), &o); !errors.Is(err, atproto.ErrNull) {
			t.Errorf("atproto.UnmarshalRead(%q) into a struct: %v, want atproto.ErrNull", doc, err)
		}
	}
	var a any = "x"
	var m map[string]any
	var p *obj
	for _, v := range []any{&a, &m, &p} {
		if err := atproto.Unmarshal([]byte("null"), v); err != nil {
			t.Errorf("null into %T: %v", v, err)
		}
	}
	if a != nil || m != nil || p != nil {
		t.Errorf("null left %v, %v, %v", a, m, p)
	}
	var o obj
	if err := atproto.UnmarshalRead(strings.NewReader(`{"a":"b"}`), &o); err != nil || o.A != "b" {
		t.Errorf("UnmarshalRead of an object: %v, %+v", err, o)
	}
	if err := atproto.Unmarshal([]byte(`"null"`), &o); err == nil || errors.Is(err, atproto.ErrNull) {
		t.Errorf("the string \"null\" into a struct: %v, want a type error", err)
	}
}
