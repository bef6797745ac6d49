package config

import (
	"errors"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"
)

// checkURL refuses, naming key, a URL outbound.Check refuses for schemes.
func checkURL(key, raw string, schemes ...string) error {
	_, err := outbound.CheckURL(raw, schemes...)
	var e *outbound.URLError
	switch {
	case errors.As(err, &e) && e.Credentials:
		// No URL key takes credentials. A websocket endpoint
		// (jetstream.urls, labeler.url) is dialed by gorilla/websocket,
		// which refuses a URL with them (RFC 6455 §3 has no userinfo):
		// accepted, it would fail every dial for ever and log the
		// password with each failure. The others are public endpoints
		// (relays, PLC, Stripe's API) or this instance's own URLs, which
		// are stored in the database (admin.advertise_url, a backfill's
		// relay) or sent to others (webhooks.public_url): a password
		// there would be logged, stored or handed out.
		if slices.Contains(schemes, "ws") {
			return keyErr(key, "%s, which an endpoint dialed as a websocket cannot send; remove them", e.Reason)
		}
		return keyErr(key, "%s, which would be logged and stored in the clear; remove them", e.Reason)
	case err != nil:
		return keyErr(key, "%s", err.Error())
	}
	return nil
}

// checkList refuses an empty element and an element listed twice in the
// list-valued key key, naming the element's position (1-based). Two
// elements are the same when same gives them the same form. (Loading
// already refuses empty elements by position, with the file's line; this
// covers a Config built in code too.) webhooks.retry_schedule, the one
// list of durations, is not checked for repeats: a schedule may space
// several attempts alike (0s, 30s, 30s).
func checkList(key string, items []string, same func(string) string) error {
	first := make(map[string]int, len(items))
	for i, item := range items {
		if strings.TrimSpace(item) == "" {
			return keyErr(key, "element %d is empty", i+1)
		}
		form := same(item)
		j, seen := first[form]
		switch {
		case !seen:
			first[form] = i
		case strings.TrimSpace(items[j]) == strings.TrimSpace(item):
			return keyErr(key, "%q is listed twice (elements %d and %d)", redacted(strings.TrimSpace(item)), j+1, i+1)
		default:
			return keyErr(key, "element %d (%q) is the same endpoint as element %d (%q); list it once", i+1, redacted(item), j+1, redacted(items[j]))
		}
	}
	return nil
}

// redacted is s with a URL's password replaced by xxxxx (s itself when
// it is not a URL with one), for error messages.
func redacted(s string) string {
	if u, err := url.Parse(strings.TrimSpace(s)); err == nil && u.User != nil {
		return u.Redacted()
	}
	return logval.MaskURL(s)
}

// sameEndpoint is the form in which two endpoint URLs of a list are
// compared: surrounding whitespace dropped, the URL's canonical form
// (outbound.Canonical: scheme and host case, the scheme's default port —
// wss://h:443/x is wss://h/x, and so is an empty port, wss://h:/x —
// percent-encoding and dot segments make no difference), and one
// trailing slash of the path dropped. A trailing slash counts as the same
// endpoint because the code that uses these lists ignores it too:
// backfill trims it from a relay's base URL before appending /xrpc/...,
// and Jetstream's wire is chosen by the path without it. Listing one
// endpoint twice would only make the consumer or the backfill fail over
// to the host it is leaving. A URL that does not parse is compared as
// written (its own check refuses it).
func sameEndpoint(raw string) string {
	raw = strings.TrimSpace(raw)
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	c, err := url.Parse(outbound.CanonicalURL(u))
	if err != nil {
		return raw
	}
	c.Path = strings.TrimSuffix(c.Path, "/")
	c.RawPath = strings.TrimSuffix(c.RawPath, "/")
	return c.String()
}

// The two Jetstream paths (internal/jetstream WireOf; this package does
// not import it): the v2 XRPC method and the legacy /subscribe.
const (
	jetstreamPathV2     = "/xrpc/network.bsky.jetstream.subscribeEvents"
	jetstreamPathLegacy = "/subscribe"
)

// jetstreamQuerySet are the subscription parameters the consumer sets on
// every connection itself (from jetstream.collections, its position and
// jetstream.compress); jetstreamQueryNarrowing are those that would narrow
// the stream under it. Jetstream (v1 and v2) reads both sets; a URL
// carrying one is refused rather than overridden or passed on.
var (
	jetstreamQuerySet = map[string]string{
		"wantedCollections": "from jetstream.collections", "collections": "from jetstream.collections",
		"cursor": "at its stored position", "compress": "after jetstream.compress",
		"zstdDictionary": "after jetstream.compress",
	}
	jetstreamQueryNarrowing = map[string]string{
		"wantedDids":          "commits of other repositories would never arrive",
		"dids":                "commits of other repositories would never arrive",
		"kinds":               "identity, account or #sync events (takedowns, deactivations, re-reads) could stop arriving",
		"maxMessageSizeBytes": "the host would drop larger events silently, where the consumer counts and logs each",
	}
)

// checkJetstreamQuery refuses a jetstream.urls entry whose query sets a
// subscription parameter: one the consumer sets itself, one that narrows
// the stream (a filter by DID or event kind, a size limit), or, on the v2
// path, requireHello (the v2 wire takes no client frames, so the host
// would wait forever; Jetstream v2 answers 400). Other parameters (a
// proxy's token) are kept and sent.
func checkJetstreamQuery(raw string) error {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return nil // checkURL reported it
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return keyErr("jetstream.urls", "%q: query: %v", raw, err)
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if from, ok := jetstreamQuerySet[k]; ok {
			return keyErr("jetstream.urls", "%q: remove %s=: the consumer sets it on every connection, %s", raw, k, from)
		}
		if why, ok := jetstreamQueryNarrowing[k]; ok {
			return keyErr("jetstream.urls", "%q: remove %s=: %s", raw, k, why)
		}
		if k == "requireHello" && strings.TrimSuffix(u.Path, "/") == jetstreamPathV2 {
			return keyErr("jetstream.urls", "%q: remove requireHello=: the v2 wire takes no client messages (Jetstream v2 refuses it)", raw)
		}
	}
	return nil
}

// checkJetstreamPath refuses a jetstream.urls element whose path is
// neither Jetstream path (one trailing slash aside): exactly the v2 path
// (WireOf picks the v2 wire only for it), or one ending in /subscribe (a
// proxy's prefix before it is kept; the legacy wire dials it as given).
// Anything else the consumer would dial as the legacy wire and retry its
// failed handshake for ever (a typo of the v2 path, "/x"), as labeler.url
// would.
func checkJetstreamPath(raw string) error {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return nil // checkURL reported it
	}
	p := strings.TrimSuffix(u.Path, "/")
	if p == jetstreamPathV2 || strings.HasSuffix(p, jetstreamPathLegacy) {
		return nil
	}
	return keyErr("jetstream.urls", "%q: path %q is neither %s (Jetstream v2) nor %s (legacy); give the full endpoint URL", raw, u.Path, jetstreamPathV2, jetstreamPathLegacy)
}

// labelerSubscribePath is com.atproto.label.subscribeLabels' XRPC path
// (actors/labeler SubscribeURL; this package does not import it).
const labelerSubscribePath = "/xrpc/com.atproto.label.subscribeLabels"

// checkLabelerPath refuses a labeler.url whose path is neither empty (the
// labeler's base URL, to which the subscriber appends
// labelerSubscribePath) nor one ending in labelerSubscribePath (one
// trailing slash aside), as actors/labeler SubscribeURL does when the
// worker is built: checked here too, so that `config check` refuses
// every labeler.url `serve` does. The subscriber would dial any other
// path and retry its 404 for ever.
func checkLabelerPath(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return nil // checkURL reported it
	}
	if p := strings.TrimSuffix(u.Path, "/"); p == "" || strings.HasSuffix(p, labelerSubscribePath) {
		return nil
	}
	return keyErr("labeler.url", "URL %q: path %q is not %s; give the labeler's base URL (https://HOST) or its full subscribeLabels URL", raw, u.Path, labelerSubscribePath)
}
