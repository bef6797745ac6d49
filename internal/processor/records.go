package processor

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// NSIDs of the io.atcr collections the processor indexes (docs/lexicons.md).
const (
	CollectionManifest = "io.atcr.manifest"
	CollectionTag      = "io.atcr.tag"
	CollectionStar     = "io.atcr.sailor.star"
	CollectionProfile  = "io.atcr.sailor.profile"
	CollectionRepoPage = "io.atcr.repo.page"
	CollectionCaptain  = "io.atcr.hold.captain"
	CollectionCrew     = "io.atcr.hold.crew"
	CollectionStats    = "io.atcr.hold.stats"
)

// Length limits from the lexicons, in UTF-8 bytes.
const (
	maxRepositoryLen     = 255
	maxPageRepositoryLen = 256
	maxDigestLen         = 128
	maxMediaTypeLen      = 128
	maxTagLen            = 128
	maxDescriptionLen    = 100000
)

// MaxContainerLen is the most elements an array or object in a record may
// have: the AT Protocol data model's limit (128 Ki, indigo's
// atproto/data MAX_CBOR_CONTAINER_LEN), which a record from a conforming
// PDS never exceeds. A manifest whose layers, manifests or annotations
// hold more is skipped (ReasonTooLong). Together with database.Chunks it
// bounds the work one record can cause.
const MaxContainerLen = 128 * 1024

// MaxSafeInteger is the largest magnitude an integer in a record may have:
// the AT Protocol data model limits integers to what JavaScript clients
// represent exactly, ±(2^53−1) (Number.MAX_SAFE_INTEGER). A record carrying
// a larger one is skipped (ReasonBadValue), and aggregates of counts
// saturate at it (see SaturatingAdd), so no sum over holds can overflow.
const MaxSafeInteger = 1<<53 - 1

// SaturatingAdd returns a + b for counts in [0, MaxSafeInteger], capped at
// MaxSafeInteger: the sum of every hold's count for one repository, which
// a few thousand holds at the limit would otherwise push past int64.
func SaturatingAdd(a, b int64) int64 {
	if a > MaxSafeInteger-b {
		return MaxSafeInteger
	}
	return a + b
}

// invalidError is a record that breaks its lexicon; reason is the skip
// reason it is counted under.
type invalidError struct {
	reason string
	detail string
}

func (e *invalidError) Error() string { return e.reason + ": " + e.detail }

func invalid(reason, format string, args ...any) error {
	return &invalidError{reason: reason, detail: fmt.Sprintf(format, args...)}
}

// reasonOf maps an error from decoding to its skip reason.
func reasonOf(err error) string {
	var ie *invalidError
	if errors.As(err, &ie) {
		return ie.reason
	}
	return ReasonMalformedRecord
}

// check accumulates the first validation failure of a record.
type check struct{ err error }

// recordType is the $type member every record struct embeds.
type recordType struct {
	Type *string `json:"$type"`
}

// recordType checks a record's $type against the collection it was
// written to: a record names its own lexicon (atproto.com/specs/lexicon,
// "record" type), and the reference AppView refuses one whose $type is
// not its collection's NSID. An absent $type is accepted, as the
// registry's published records are read (LEXICONS.md); a present one
// that differs is ReasonBadValue.
func (c *check) recordType(collection string, t *string) {
	if c.err == nil && t != nil && *t != collection {
		c.err = invalid(ReasonBadValue, "$type %q is not the collection %s", *t, collection)
	}
}

func (c *check) required(field string, present bool) {
	if c.err == nil && !present {
		c.err = invalid(ReasonMissingField, "%s is required", field)
	}
}

func (c *check) maxLen(field, v string, limit int) {
	if c.err == nil && len(v) > limit {
		c.err = invalid(ReasonTooLong, "%s is %d bytes, limit %d", field, len(v), limit)
	}
}

// elements checks the element count of an array or object.
func (c *check) elements(field string, n int) {
	if c.err == nil && n > MaxContainerLen {
		c.err = invalid(ReasonTooLong, "%s has %d elements, limit %d", field, n, MaxContainerLen)
	}
}

func (c *check) nonEmpty(field string, v *string) {
	if c.err == nil && v != nil && *v == "" {
		c.err = invalid(ReasonMissingField, "%s is empty", field)
	}
}

func (c *check) did(field string, v string) {
	if c.err == nil && !validDID(v) {
		c.err = invalid(ReasonBadValue, "%s %q is not a DID", field, v)
	}
}

// key checks a string that names a row (repository, digest, tag): SQLite
// text with a NUL or invalid UTF-8 compares and truncates unpredictably
// (C string APIs stop at the NUL), so two different records could land on
// one key, or a key could not be read back as it was written.
func (c *check) key(field, v string) {
	if c.err == nil && !validKey(v) {
		c.err = invalid(ReasonBadValue, "%s %q contains a NUL or invalid UTF-8", field, v)
	}
}

// text checks a stored string that names nothing (a media type, an
// annotation, a description, a region): no NUL byte, which SQLite's C
// API would cut the value at (database.ErrTextNUL), so that "v\u0000tail"
// would be stored as "v". Invalid UTF-8 cannot reach it: the frame
// decoder refuses it.
func (c *check) text(field, v string) {
	if c.err == nil && strings.IndexByte(v, 0) >= 0 {
		c.err = invalid(ReasonBadValue, "%s %q contains a NUL", field, v)
	}
}

// count checks a count: an integer in [0, MaxSafeInteger].
func (c *check) count(field string, v int64) {
	if c.err == nil && (v < 0 || v > MaxSafeInteger) {
		c.err = invalid(ReasonBadValue, "%s %d is outside [0, %d]", field, v, int64(MaxSafeInteger))
	}
}

// integer checks any other record integer against the data model's range.
func (c *check) integer(field string, v int64) {
	if c.err == nil && (v < -MaxSafeInteger || v > MaxSafeInteger) {
		c.err = invalid(ReasonBadValue, "%s %d is outside the AT Protocol integer range ±%d", field, v, int64(MaxSafeInteger))
	}
}

// blob checks an OCI descriptor (config, subject, a layer, a manifest of
// an index): a digest is required and must be one, and the size is a
// byte count (never negative).
func (c *check) blob(field string, b *blobRef) {
	c.required(field+".digest", b.Digest != "")
	c.text(field+".mediaType", b.MediaType)
	c.key(field+".digest", b.Digest)
	c.digest(field+".digest", b.Digest)
	c.count(field+".size", b.Size)
}

// isDigest reports whether v follows the digest grammar of the OCI image
// specification (descriptor.md, "Digests"), the regular expression
// ^[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$: algorithm ":"
// encoded, where algorithm is components of [a-z0-9] joined by one of
// "+._-" and encoded is [a-zA-Z0-9=_-]+. Only the grammar: an algorithm
// it does not know is not refused, nor an encoded part of another length
// than the algorithm's. A scan rather than the regular expression: it
// runs for every manifest, layer and tag record, and the regexp was 3% of
// the ingest profile's CPU (docs/performance.md); a test holds the two
// equal.
func isDigest(v string) bool {
	alg, enc, ok := strings.Cut(v, ":")
	if !ok || alg == "" || enc == "" {
		return false
	}
	joined := true // at the start, or just after a separator
	for i := 0; i < len(alg); i++ {
		switch b := alg[i]; {
		case 'a' <= b && b <= 'z', '0' <= b && b <= '9':
			joined = false
		case b == '+' || b == '.' || b == '_' || b == '-':
			if joined {
				return false
			}
			joined = true
		default:
			return false
		}
	}
	if joined {
		return false
	}
	for i := 0; i < len(enc); i++ {
		switch b := enc[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '=', b == '_', b == '-':
		default:
			return false
		}
	}
	return true
}

// digest checks a non-empty digest against the OCI grammar (isDigest;
// ReasonBadValue); "" is left to required and nonEmpty.
func (c *check) digest(field, v string) {
	if c.err == nil && v != "" && !isDigest(v) {
		c.err = invalid(ReasonBadValue, "%s %q is not a digest (algorithm:encoded, as the OCI image specification writes one)", field, v)
	}
}

// name checks a repository or tag name beyond key: no control character
// (a CR/LF would split a header or a log line built from it), no white
// space, which no OCI reference can carry, and no invisible (format)
// character such as U+200B, which would make two names look alike. Other
// Unicode is kept: the registry's names are not limited to the OCI
// distribution grammar.
func (c *check) name(field, v string) {
	c.key(field, v)
	if c.err == nil && strings.IndexFunc(v, func(r rune) bool {
		return unicode.IsControl(r) || unicode.IsSpace(r) || unicode.Is(unicode.Cf, r)
	}) >= 0 {
		c.err = invalid(ReasonBadValue, "%s %q contains a control, white-space or invisible character", field, v)
	}
}

// repository checks a repository name: a name whose "/"-separated path
// segments are none empty, "." or "..", so a URL built from it (the
// webhook's repo_url, the status page's links) stays under the owner's
// path.
func (c *check) repository(field, v string) {
	c.name(field, v)
	if c.err != nil {
		return
	}
	for seg := range strings.SplitSeq(v, "/") {
		if seg == "" || seg == "." || seg == ".." {
			c.err = invalid(ReasonBadValue, "%s %q has an empty, \".\" or \"..\" path segment", field, v)
			return
		}
	}
}

// CheckRepository returns why a repository name could never be stored
// (the check a record's repository field gets: no NUL, invalid UTF-8,
// control, white-space or invisible character, no empty, "." or ".."
// path segment), or nil. For readers that take a name from outside, so
// that a name no record can carry is refused rather than answered as
// empty.
func CheckRepository(v string) error {
	var c check
	c.repository("repository", v)
	var ie *invalidError
	if errors.As(c.err, &ie) {
		return errors.New(ie.detail) // the words, without the skip reason
	}
	return c.err
}

// tagName checks a tag: a name without "/" (a tag is one path segment of
// an OCI reference) and not "." or "..".
func (c *check) tagName(field, v string) {
	c.name(field, v)
	if c.err == nil && (strings.Contains(v, "/") || v == "." || v == "..") {
		c.err = invalid(ReasonBadValue, "%s %q is not a single path segment", field, v)
	}
}

func validKey(v string) bool {
	return utf8.ValidString(v) && !strings.ContainsRune(v, 0)
}

// datetime parses an AT Protocol datetime into Unix ms: the Lexicon
// datetime syntax (the intersection of RFC 3339 and ISO 8601, with an
// explicit offset), as syntax.ParseDatetime checks it; Go's RFC 3339
// parser alone accepts forms the specification refuses (T3:20:50,
// -00:00).
func (c *check) datetime(field string, v *string) int64 {
	if c.err != nil || v == nil {
		return 0
	}
	t, err := atproto.ParseDatetime(*v)
	if err != nil {
		c.err = invalid(ReasonBadValue, "%s %q is not an AT Protocol datetime", field, *v)
		return 0
	}
	return t.UnixMilli()
}

// validDID reports whether s is a DID by the AT Protocol syntax
// (atproto.com/specs/did: ASCII only, at most 2,048 bytes), so no NUL or
// invalid UTF-8 can reach a key column through a DID.
func validDID(s string) bool {
	_, err := syntax.ParseDID(s)
	return err == nil
}

// validRKey reports whether s is a record key by the AT Protocol syntax
// (atproto.com/specs/record-key: 1 to 512 ASCII letters, digits and
// ._:~-, not "." or "..").
func validRKey(s string) bool {
	_, err := syntax.ParseRecordKey(s)
	return err == nil
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// parseATURI splits an AT-URI naming one record, at://DID/COLLECTION/RKEY
// (atproto.com/specs/at-uri-scheme, as syntax.ParseATURI checks it, with
// a DID authority: a handle could change hands).
func parseATURI(s string) (did, collection, rkey string, ok bool) {
	u, err := syntax.ParseATURI(s)
	if err != nil {
		return "", "", "", false
	}
	auth, coll, key := u.Authority(), u.Collection(), u.RecordKey()
	if !auth.IsDID() || coll == "" || key == "" {
		return "", "", "", false
	}
	return auth.String(), coll.String(), key.String(), true
}
