package labeler

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/atcr-io/appview/internal/workers"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/logval"
)

// LeaseName is the lease the subscriber runs under (docs/spec.md §4).
const LeaseName = "labeler-subscriber"

// subscribePath is the XRPC path of com.atproto.label.subscribeLabels.
const subscribePath = "/xrpc/com.atproto.label.subscribeLabels"

// errDisabled wraps workers.ErrDisabled with the key that disables this worker.
var errDisabled = fmt.Errorf("labeler subscriber disabled (labeler.url is empty): %w", workers.ErrDisabled)

// Worker describes the labeler subscriber to the registry: a leased actor
// worker named LeaseName. Its metrics are registered on d.Metrics here,
// once per process. Errors: workers.ErrDisabled (wrapped); a *config.Error for a bad
// labeler.url or labeler.stale_timeout; a metrics registration error.
func Worker(d workers.Deps) (workers.Spec, error) {
	cfg := d.Config.Labeler
	if cfg.URL == "" {
		return workers.Spec{}, errDisabled
	}
	endpoint, err := SubscribeURL(cfg.URL)
	if err != nil {
		return workers.Spec{}, &config.Error{Key: "labeler.url", Reason: err.Error()}
	}
	metrics, err := NewMetrics(d.Metrics)
	if err != nil {
		return workers.Spec{}, err
	}
	o := Options{
		DB:           d.DB,
		Log:          d.Log,
		Endpoint:     endpoint,
		StaleTimeout: cfg.StaleTimeout,
		Metrics:      metrics,
	}
	return workers.Spec{
		Name:   LeaseName,
		Leased: true,
		Actor:  func(c fence.Custody) *actor.Props { return NewProps(o, c) },
	}, nil
}

// SubscribeURL turns labeler.url into the websocket URL of
// com.atproto.label.subscribeLabels. The scheme maps https → wss and
// http → ws (ws and wss stay). The path must be one of:
//
//   - empty or "/": the labeler's base URL; the XRPC path is appended
//     (https://HOST → wss://HOST/xrpc/com.atproto.label.subscribeLabels);
//   - a path ending in /xrpc/com.atproto.label.subscribeLabels (one
//     trailing slash dropped): the full endpoint, used as given, so a
//     labeler behind a path prefix works (wss://HOST/mod/xrpc/...).
//
// Any other path is refused: the subscriber would dial it and retry its
// 404 forever (ws://HOST/labeler is not a subscribeLabels endpoint).
// Query and fragment are dropped (the cursor is added per connection);
// credentials (user:password@) are refused, never sent nor logged.
func SubscribeURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("unparsable URL %q: %s", logval.MaskURL(raw), logval.URLParseReason(err))
	}
	asGiven := u.Redacted() // the password replaced by xxxxx
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	case "http":
		u.Scheme = "ws"
	case "ws", "wss":
	default:
		return "", fmt.Errorf("URL %q: scheme must be https, http, wss or ws", logval.MaskURL(raw))
	}
	if u.Host == "" {
		return "", fmt.Errorf("URL %q has no host", logval.MaskURL(raw))
	}
	if u.User != nil {
		// Refused, not dropped: a labeler that needs them would answer
		// 401 to every connection, retried for ever.
		return "", fmt.Errorf("URL %s carries credentials (user:password@), which the subscriber does not send: subscribeLabels is public; remove them",
			asGiven)
	}
	switch p := strings.TrimSuffix(u.Path, "/"); {
	case p == "":
		u.Path = subscribePath
	case strings.HasSuffix(p, subscribePath):
		u.Path = p
	default:
		return "", fmt.Errorf("URL %q: path %q is not %s; give the labeler's base URL (https://HOST) or its full subscribeLabels URL",
			raw, u.Path, subscribePath)
	}
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	return u.String(), nil
}
