package jetstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/atcr-io/appview/internal/logval"
)

// maxDictBytes bounds a fetched zstd dictionary (Jetstream's is 64 KiB).
const maxDictBytes = 4 << 20

// v2Decoder returns the decoder for base's v2 compressed frames and the
// dictionary ID to ask for, fetching the host's dictionary on first use
// (fresh is then true). Any failure degrades to uncompressed frames
// (c.dec, 0), logged: compression must never stop the stream.
func (c *Client) v2Decoder(ctx context.Context, base string) (dec *Decoder, id uint32, fresh bool) {
	host := HostOf(base)
	if c.noDict[host] {
		return c.dec, 0, false
	}
	if d := c.dicts[host]; d != nil {
		return d, d.dictID, false
	}
	if time.Now().Before(c.dictRetry[host]) {
		return c.dec, 0, false
	}
	d, err := c.fetchDictionary(ctx, base)
	var te *transientDictError
	switch {
	case errors.As(err, &te):
		// The host (or the way to it) is failing now, as it may at the
		// moment a failover dials it: read it uncompressed for now and
		// ask again later. Said at warn for the first failure only: with
		// the host unreachable every minute would say it again, and the
		// consumer already says once that it is unhealthy.
		_, again := c.dictRetry[host]
		c.dictRetry[host] = time.Now().Add(dictRetryAfter)
		ev := c.opts.Log.Warn()
		if again {
			ev = c.opts.Log.Debug()
		}
		ev.Err(err).Str("url", logval.RedactURL(base)).Int64("retry_in_ms", dictRetryAfter.Milliseconds()).
			Msg("jetstream: zstd dictionary not fetched; reading this host uncompressed for now")
		return c.dec, 0, false
	case err != nil:
		c.noDict[host] = true
		c.opts.Log.Warn().Err(err).Str("url", logval.RedactURL(base)).Msg("jetstream: no zstd dictionary; reading this host uncompressed")
		return c.dec, 0, false
	}
	delete(c.dictRetry, host)
	c.dicts[host] = d
	return d, d.dictID, true
}

// dictRetryAfter is how long a host whose dictionary could not be fetched
// for a transient reason is read uncompressed before the fetch is tried
// again.
const dictRetryAfter = time.Minute

// transientDictError is a dictionary fetch that failed for a reason that
// may pass: no answer, a 429 or a 5xx, a body cut short. Any other failure
// (the host has no dictionary endpoint, or serves something that is not a
// zstd dictionary) is for good.
type transientDictError struct{ err error }

func (e *transientDictError) Error() string { return e.err.Error() }

func (e *transientDictError) Unwrap() error { return e.err }

func (c *Client) fetchDictionary(ctx context.Context, base string) (*Decoder, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	u.Scheme = map[string]string{"ws": "http", "wss": "https"}[u.Scheme]
	// The URL's own parameters (a proxy's token) go with the request, as
	// they do with the subscription; the subscription's do not.
	q := u.Query()
	for _, k := range []string{"collections", "cursor", "zstdDictionary", "wantedCollections", "compress", "requireHello"} {
		q.Del(k)
	}
	u.Path, u.RawQuery = PathZstdDictionary, q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return nil, &transientDictError{fmt.Errorf("fetch zstd dictionary: %w", err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("fetch zstd dictionary: HTTP %d", resp.StatusCode)
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
			return nil, &transientDictError{err}
		}
		return nil, err
	}
	dict, err := io.ReadAll(io.LimitReader(resp.Body, maxDictBytes+1))
	if err != nil {
		return nil, &transientDictError{fmt.Errorf("fetch zstd dictionary: %w", err)}
	}
	if len(dict) > maxDictBytes {
		return nil, fmt.Errorf("zstd dictionary larger than %d bytes", maxDictBytes)
	}
	id, err := DictionaryIDOf(dict)
	if err != nil {
		return nil, err
	}
	d, err := NewDecoderDict(c.dec.max, dict)
	if err != nil {
		return nil, err
	}
	d.dictID = id
	return d, nil
}
