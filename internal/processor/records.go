package processor

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
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

// blobRef is the {mediaType, digest, size} descriptor of io.atcr.manifest.
type blobRef struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

type platform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant"`
}

type manifestRef struct {
	blobRef
	Platform *platform `json:"platform"`
}

type manifestRecord struct {
	recordType
	Repository    *string           `json:"repository"`
	Digest        *string           `json:"digest"`
	MediaType     *string           `json:"mediaType"`
	SchemaVersion *int64            `json:"schemaVersion"`
	CreatedAt     *string           `json:"createdAt"`
	HoldDID       *string           `json:"holdDid"`
	HoldEndpoint  *string           `json:"holdEndpoint"`
	Config        *blobRef          `json:"config"`
	Subject       *blobRef          `json:"subject"`
	Layers        []blobRef         `json:"layers"`
	Manifests     []manifestRef     `json:"manifests"`
	Annotations   map[string]string `json:"annotations"`
}

// manifest is a validated io.atcr.manifest record.
type manifest struct {
	Repository, Digest, MediaType string
	SchemaVersion                 int64
	CreatedAt                     int64 // Unix ms
	HoldDID, HoldEndpoint         string
	ConfigDigest                  string
	ConfigSize                    int64
	SubjectDigest                 string
	Layers                        []blobRef
	Manifests                     []manifestRef
	Annotations                   map[string]string
}

func decodeManifest(raw json.RawMessage) (*manifest, error) {
	var r manifestRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionManifest, r.Type)
	c.required("repository", r.Repository != nil)
	c.required("digest", r.Digest != nil)
	c.required("mediaType", r.MediaType != nil)
	c.required("schemaVersion", r.SchemaVersion != nil)
	c.required("createdAt", r.CreatedAt != nil)
	c.nonEmpty("repository", r.Repository)
	c.nonEmpty("digest", r.Digest)
	c.maxLen("repository", str(r.Repository), maxRepositoryLen)
	c.maxLen("digest", str(r.Digest), maxDigestLen)
	c.maxLen("mediaType", str(r.MediaType), maxMediaTypeLen)
	c.nonEmpty("mediaType", r.MediaType)
	c.repository("repository", str(r.Repository))
	c.key("digest", str(r.Digest))
	c.digest("digest", str(r.Digest))
	c.elements("layers", len(r.Layers))
	c.elements("manifests", len(r.Manifests))
	c.elements("annotations", len(r.Annotations))
	if r.SchemaVersion != nil {
		c.count("schemaVersion", *r.SchemaVersion)
	}
	if r.Config != nil {
		c.blob("config", r.Config)
	}
	if r.Subject != nil {
		c.blob("subject", r.Subject)
	}
	for i := range r.Layers {
		c.blob("layers", &r.Layers[i])
	}
	for i := range r.Manifests {
		c.blob("manifests", &r.Manifests[i].blobRef)
		if p := r.Manifests[i].Platform; p != nil {
			c.text("manifests.platform.os", p.OS)
			c.text("manifests.platform.architecture", p.Architecture)
			c.text("manifests.platform.variant", p.Variant)
		}
	}
	c.text("mediaType", str(r.MediaType))
	c.text("holdEndpoint", str(r.HoldEndpoint))
	for k, v := range r.Annotations {
		c.text("annotations key", k)
		c.text("annotations."+k, v)
	}
	m := &manifest{
		Repository:   str(r.Repository),
		Digest:       str(r.Digest),
		MediaType:    str(r.MediaType),
		CreatedAt:    c.datetime("createdAt", r.CreatedAt),
		HoldEndpoint: str(r.HoldEndpoint),
		Layers:       r.Layers,
		Manifests:    r.Manifests,
		Annotations:  r.Annotations,
	}
	if r.SchemaVersion != nil {
		m.SchemaVersion = *r.SchemaVersion
	}
	switch {
	case r.HoldDID != nil && *r.HoldDID != "":
		c.did("holdDid", *r.HoldDID)
		m.HoldDID = *r.HoldDID
	case m.HoldEndpoint != "":
		did, err := HoldDIDFromEndpoint(m.HoldEndpoint)
		if err != nil && c.err == nil {
			c.err = invalid(ReasonBadValue, "holdEndpoint: %v", err)
		}
		m.HoldDID = did
	}
	if r.Config != nil {
		m.ConfigDigest, m.ConfigSize = r.Config.Digest, r.Config.Size
	}
	if r.Subject != nil {
		m.SubjectDigest = r.Subject.Digest
	}
	return m, c.err
}

// HoldDIDFromEndpoint derives a hold's did:web from the legacy holdEndpoint
// URL of io.atcr.manifest (did:web method: the host, a port percent-encoded
// as %3A, path segments joined by ":"), e.g. https://hold01.example.com →
// did:web:hold01.example.com. One hold has one DID however its URL is
// spelled: the host is lower-cased, a fully qualified name's trailing dot
// and the scheme's default port (https 443, http 80) are dropped. It
// returns an error for a URL without a host, or one no did:web can name.
func HoldDIDFromEndpoint(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", err
	}
	if u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return "", fmt.Errorf("%q is not an http(s) URL with a host", endpoint)
	}
	host := strings.TrimSuffix(strings.ToLower(u.Host), ".")
	if port := u.Port(); port != "" {
		name := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
		if strings.Contains(name, ":") {
			name = "[" + name + "]" // an IPv6 literal: refused below
		}
		host = name
		if !(u.Scheme == "https" && port == "443") && !(u.Scheme == "http" && port == "80") {
			host += ":" + port
		}
	}
	did := "did:web:" + strings.ReplaceAll(host, ":", "%3A")
	for _, seg := range strings.Split(strings.Trim(u.Path, "/"), "/") {
		if seg != "" {
			did += ":" + seg
		}
	}
	if !validDID(did) {
		// A host or path with characters the DID syntax refuses (an
		// IPv6 literal's brackets, a space) names no hold.
		return "", fmt.Errorf("%q does not make a valid did:web (%q)", endpoint, did)
	}
	return did, nil
}

type tagRecord struct {
	recordType
	Repository     *string `json:"repository"`
	Tag            *string `json:"tag"`
	Manifest       *string `json:"manifest"`
	ManifestDigest *string `json:"manifestDigest"`
	CreatedAt      *string `json:"createdAt"`
	UpdatedAt      *string `json:"updatedAt"`
}

// tag is a validated io.atcr.tag record. The digest is resolved at apply
// time: from the manifest record the at-uri names, else ManifestDigest.
type tag struct {
	Repository, Tag string
	// ManifestDID and ManifestRKey locate the manifest record of the
	// at-uri in Manifest ("" when absent).
	ManifestDID, ManifestRKey string
	ManifestDigest            string
	CreatedAt, UpdatedAt      int64 // Unix ms; 0 when absent
}

func decodeTag(raw json.RawMessage) (*tag, error) {
	var r tagRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionTag, r.Type)
	c.required("repository", r.Repository != nil)
	c.required("tag", r.Tag != nil)
	c.nonEmpty("repository", r.Repository)
	c.nonEmpty("tag", r.Tag)
	c.maxLen("repository", str(r.Repository), maxRepositoryLen)
	c.maxLen("tag", str(r.Tag), maxTagLen)
	c.maxLen("manifestDigest", str(r.ManifestDigest), maxDigestLen)
	c.repository("repository", str(r.Repository))
	c.tagName("tag", str(r.Tag))
	c.key("manifestDigest", str(r.ManifestDigest))
	c.digest("manifestDigest", str(r.ManifestDigest))
	t := &tag{
		Repository:     str(r.Repository),
		Tag:            str(r.Tag),
		ManifestDigest: str(r.ManifestDigest),
		CreatedAt:      c.datetime("createdAt", r.CreatedAt),
		UpdatedAt:      c.datetime("updatedAt", r.UpdatedAt),
	}
	if r.Manifest != nil && *r.Manifest != "" {
		did, coll, rkey, ok := parseATURI(*r.Manifest)
		if (!ok || coll != CollectionManifest) && c.err == nil {
			c.err = invalid(ReasonBadValue, "manifest %q is not an at-uri of an %s record", *r.Manifest, CollectionManifest)
		}
		t.ManifestDID, t.ManifestRKey = did, rkey
	}
	if c.err == nil && t.ManifestRKey == "" && t.ManifestDigest == "" {
		c.err = invalid(ReasonMissingField, "one of manifest and manifestDigest is required")
	}
	return t, c.err
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

type starSubject struct {
	DID        string `json:"did"`
	Repository string `json:"repository"`
}

type starRecord struct {
	recordType
	Subject   json.RawMessage `json:"subject"`
	CreatedAt *string         `json:"createdAt"`
}

// star is a validated io.atcr.sailor.star record.
type star struct {
	OwnerDID, Repository string
	CreatedAt            int64
}

func decodeStar(raw json.RawMessage) (*star, error) {
	var r starRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionStar, r.Type)
	c.required("subject", len(r.Subject) > 0 && string(r.Subject) != "null")
	c.required("createdAt", r.CreatedAt != nil)
	s := &star{CreatedAt: c.datetime("createdAt", r.CreatedAt)}
	if c.err != nil {
		return nil, c.err
	}
	// Two published shapes: an object {did, repository}, or the at-uri of
	// the starred repository's io.atcr.repo.page record.
	var uri string
	if atproto.Unmarshal(r.Subject, &uri) == nil {
		did, coll, rkey, ok := parseATURI(uri)
		if !ok || coll != CollectionRepoPage {
			return nil, invalid(ReasonBadValue, "subject %q is not an at-uri of an %s record", uri, CollectionRepoPage)
		}
		s.OwnerDID, s.Repository = did, rkey
	} else {
		var obj starSubject
		if err := atproto.Unmarshal(r.Subject, &obj); err != nil {
			return nil, invalid(ReasonMalformedRecord, "subject: %v", err)
		}
		s.OwnerDID, s.Repository = obj.DID, obj.Repository
		c.required("subject.did", obj.DID != "")
		c.required("subject.repository", obj.Repository != "")
	}
	c.did("subject.did", s.OwnerDID)
	c.maxLen("subject.repository", s.Repository, maxPageRepositoryLen)
	c.repository("subject.repository", s.Repository)
	return s, c.err
}

type profileRecord struct {
	recordType
	CreatedAt          *string `json:"createdAt"`
	UpdatedAt          *string `json:"updatedAt"`
	DefaultHold        *string `json:"defaultHold"`
	AutoRemoveUntagged *bool   `json:"autoRemoveUntagged"`
}

// profile is a validated io.atcr.sailor.profile record.
type profile struct {
	CreatedAt, UpdatedAt int64 // UpdatedAt 0 when absent
	DefaultHold          string
	AutoRemoveUntagged   bool
}

func decodeProfile(rkey string, raw json.RawMessage) (*profile, error) {
	var r profileRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionProfile, r.Type)
	if rkey != "self" {
		c.err = invalid(ReasonBadValue, "record key %q, want literal self", rkey)
	}
	c.required("createdAt", r.CreatedAt != nil)
	p := &profile{
		CreatedAt:   c.datetime("createdAt", r.CreatedAt),
		UpdatedAt:   c.datetime("updatedAt", r.UpdatedAt),
		DefaultHold: str(r.DefaultHold),
	}
	if p.DefaultHold != "" {
		c.did("defaultHold", p.DefaultHold)
	}
	if r.AutoRemoveUntagged != nil {
		p.AutoRemoveUntagged = *r.AutoRemoveUntagged
	}
	return p, c.err
}

// atprotoBlob is a blob reference in either form the data model has
// (atproto.com/specs/data-model, "Blob Type"): the current one,
// {"$type": "blob", "ref": {"$link": CID}, "mimeType", "size"}, or the
// legacy one still found in old records, {"cid": CID, "mimeType"}, which
// implementations must keep reading.
type atprotoBlob struct {
	Ref *struct {
		Link string `json:"$link"`
	} `json:"ref"`
	// LegacyCID is the legacy form's "cid".
	LegacyCID string `json:"cid"`
}

// cid returns the blob's CID, from whichever form it is in ("" for
// neither).
func (b *atprotoBlob) cid() string {
	if b.Ref != nil && b.Ref.Link != "" {
		return b.Ref.Link
	}
	return b.LegacyCID
}

type repoPageRecord struct {
	recordType
	Repository  *string      `json:"repository"`
	Description *string      `json:"description"`
	Avatar      *atprotoBlob `json:"avatar"`
	CreatedAt   *string      `json:"createdAt"`
	UpdatedAt   *string      `json:"updatedAt"`
}

// repoPage is a validated io.atcr.repo.page record.
type repoPage struct {
	Repository, Description, AvatarCID string
	CreatedAt, UpdatedAt               int64
}

func decodeRepoPage(raw json.RawMessage) (*repoPage, error) {
	var r repoPageRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionRepoPage, r.Type)
	c.required("repository", r.Repository != nil)
	c.required("createdAt", r.CreatedAt != nil)
	c.required("updatedAt", r.UpdatedAt != nil)
	c.nonEmpty("repository", r.Repository)
	c.maxLen("repository", str(r.Repository), maxPageRepositoryLen)
	c.maxLen("description", str(r.Description), maxDescriptionLen)
	c.repository("repository", str(r.Repository))
	c.text("description", str(r.Description))
	p := &repoPage{
		Repository:  str(r.Repository),
		Description: str(r.Description),
		CreatedAt:   c.datetime("createdAt", r.CreatedAt),
		UpdatedAt:   c.datetime("updatedAt", r.UpdatedAt),
	}
	if r.Avatar != nil {
		p.AvatarCID = r.Avatar.cid()
		if _, err := syntax.ParseCID(p.AvatarCID); err != nil && c.err == nil {
			c.err = invalid(ReasonBadValue, "avatar: %q is not a CID (in either blob form)", p.AvatarCID)
		}
	}
	return p, c.err
}

type captainRecord struct {
	recordType
	Owner              *string `json:"owner"`
	Public             *bool   `json:"public"`
	AllowAllCrew       *bool   `json:"allowAllCrew"`
	EnableBlueskyPosts *bool   `json:"enableBlueskyPosts"`
	DeployedAt         *string `json:"deployedAt"`
	Region             *string `json:"region"`
	Provider           *string `json:"provider"`
	Successor          *string `json:"successor"`
}

// captain is a validated io.atcr.hold.captain record.
type captain struct {
	Owner                                    string
	Public, AllowAllCrew, EnableBlueskyPosts bool
	DeployedAt                               int64
	Region, Provider, Successor              string
}

func decodeCaptain(rkey string, raw json.RawMessage) (*captain, error) {
	var r captainRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionCaptain, r.Type)
	if rkey != "self" {
		c.err = invalid(ReasonBadValue, "record key %q, want literal self", rkey)
	}
	c.required("owner", r.Owner != nil)
	c.required("public", r.Public != nil)
	c.required("allowAllCrew", r.AllowAllCrew != nil)
	c.required("enableBlueskyPosts", r.EnableBlueskyPosts != nil)
	c.required("deployedAt", r.DeployedAt != nil)
	if c.err != nil {
		return nil, c.err
	}
	c.did("owner", *r.Owner)
	if s := str(r.Successor); s != "" {
		c.did("successor", s)
	}
	c.text("region", str(r.Region))
	c.text("provider", str(r.Provider))
	return &captain{
		Owner:              *r.Owner,
		Public:             *r.Public,
		AllowAllCrew:       *r.AllowAllCrew,
		EnableBlueskyPosts: *r.EnableBlueskyPosts,
		DeployedAt:         c.datetime("deployedAt", r.DeployedAt),
		Region:             str(r.Region),
		Provider:           str(r.Provider),
		Successor:          str(r.Successor),
	}, c.err
}

type crewRecord struct {
	recordType
	Member      *string   `json:"member"`
	Role        *string   `json:"role"`
	Permissions *[]string `json:"permissions"`
	AddedAt     *string   `json:"addedAt"`
	Tier        *string   `json:"tier"`
}

// crew is a validated io.atcr.hold.crew record.
type crew struct {
	Member, Role string
	Permissions  string // JSON array of strings
	AddedAt      int64
	Tier         string
}

func decodeCrew(raw json.RawMessage) (*crew, error) {
	var r crewRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionCrew, r.Type)
	c.required("member", r.Member != nil)
	c.required("role", r.Role != nil)
	c.required("permissions", r.Permissions != nil)
	c.required("addedAt", r.AddedAt != nil)
	c.nonEmpty("role", r.Role)
	if c.err != nil {
		return nil, c.err
	}
	c.did("member", *r.Member)
	c.text("role", *r.Role)
	c.text("tier", str(r.Tier))
	for _, p := range *r.Permissions {
		c.text("permissions", p)
	}
	perms, err := json.Marshal(*r.Permissions)
	if err != nil {
		return nil, invalid(ReasonMalformedRecord, "permissions: %v", err)
	}
	return &crew{
		Member:      *r.Member,
		Role:        *r.Role,
		Permissions: string(perms),
		AddedAt:     c.datetime("addedAt", r.AddedAt),
		Tier:        str(r.Tier),
	}, c.err
}

type statsRecord struct {
	recordType
	OwnerDID   *string `json:"ownerDid"`
	Repository *string `json:"repository"`
	PullCount  *int64  `json:"pullCount"`
	PushCount  *int64  `json:"pushCount"`
	UpdatedAt  *string `json:"updatedAt"`
	LastPull   *string `json:"lastPull"`
	LastPush   *string `json:"lastPush"`
}

func decodeStats(raw json.RawMessage) (*HoldStat, error) {
	var r statsRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionStats, r.Type)
	c.required("ownerDid", r.OwnerDID != nil)
	c.required("repository", r.Repository != nil)
	c.required("pullCount", r.PullCount != nil)
	c.required("pushCount", r.PushCount != nil)
	c.required("updatedAt", r.UpdatedAt != nil)
	c.nonEmpty("repository", r.Repository)
	if c.err != nil {
		return nil, c.err
	}
	c.did("ownerDid", *r.OwnerDID)
	c.maxLen("repository", *r.Repository, maxPageRepositoryLen)
	c.repository("repository", *r.Repository)
	c.count("pullCount", *r.PullCount)
	c.count("pushCount", *r.PushCount)
	s := &HoldStat{
		OwnerDID:   *r.OwnerDID,
		Repository: *r.Repository,
		PullCount:  *r.PullCount,
		PushCount:  *r.PushCount,
		UpdatedAt:  c.datetime("updatedAt", r.UpdatedAt),
	}
	if r.LastPull != nil {
		v := c.datetime("lastPull", r.LastPull)
		s.LastPull = &v
	}
	if r.LastPush != nil {
		v := c.datetime("lastPush", r.LastPush)
		s.LastPush = &v
	}
	return s, c.err
}
