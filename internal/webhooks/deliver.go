package webhooks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/outbound"
)

// Request headers of docs/spec.md §9.
const (
	// HeaderEvent carries the trigger name, e.g. "push".
	HeaderEvent = "X-Appview-Event"
	// HeaderDelivery carries the event key, the same on every attempt.
	HeaderDelivery = "X-Appview-Delivery"
	// HeaderFence carries "<lease>:<fence>", the custody that sent the request.
	HeaderFence = "X-Appview-Fence"
	// HeaderSignature carries "sha256=<hex HMAC-SHA256 of the body>" when
	// the webhook has a secret.
	HeaderSignature = "X-Appview-Signature"
)

const (
	userAgent = "atcr-appview-webhooks/1"
	// errorBodyBytes is how much of a non-2xx answer is kept in last_error.
	errorBodyBytes = 256
	// drainBytes bounds how much of an answer is read so the connection
	// can be reused; anything longer is cut off.
	drainBytes = 64 << 10
)

// Signature is the X-Appview-Signature value for body under secret:
// "sha256=" + hex(HMAC-SHA256(secret, body)). Receivers recompute it over
// the raw body and compare with hmac.Equal.
func Signature(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// attempt is one claimed delivery, ready to send.
type attempt struct {
	id        int64
	webhookID int64
	eventKey  string
	trigger   string
	url       string
	secret    string
	body      []byte
	// number is this attempt's 1-based number (the row's attempts after the claim).
	number int
}

// result classifies how an attempt ended.
type result int

const (
	resultDelivered result = iota
	// resultFailed: non-2xx or no answer; retried while the schedule lasts.
	resultFailed
	// resultRefused: the guard refused the address; final.
	resultRefused
	// resultAbandoned: the dispatcher stopped mid-request; nothing is recorded.
	resultAbandoned
)

// response is what one HTTP attempt produced.
type response struct {
	result  result
	status  int    // HTTP status, 0 when there was no answer
	message string // for last_error; "" when delivered
	elapsed time.Duration
	// retryAfter is the least wait before the next attempt that a 429 or
	// 503 asked for (Retry-After, else RateLimit-Reset), at most
	// maxReceiverRetryAfter; 0 when none was asked.
	retryAfter time.Duration
}

// maxReceiverRetryAfter bounds how long a receiver's Retry-After can hold
// a delivery back: a receiver that asks for days would otherwise keep the
// delivery pending, unreported, for days.
const maxReceiverRetryAfter = time.Hour

// send POSTs the attempt's stored body once. ctx is the dispatcher's life;
// timeout bounds this attempt (webhooks.timeout); clock stamps
// webhook-timestamp (nil: time.Now).
func send(ctx context.Context, client *http.Client, custody fence.Custody, a attempt, timeout time.Duration, clock func() time.Time) response {
	if _, err := parseTarget(a.url); err != nil {
		return response{result: resultRefused, message: err.Error()}
	}
	reqCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, a.url, bytes.NewReader(a.body))
	if err != nil {
		return response{result: resultRefused, message: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set(HeaderEvent, a.trigger)
	req.Header.Set(HeaderDelivery, a.eventKey)
	req.Header.Set(HeaderFence, custody.String())
	if clock == nil {
		clock = time.Now
	}
	now := clock()
	req.Header.Set(HeaderWebhookID, a.eventKey)
	req.Header.Set(HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
	if a.secret != "" {
		req.Header.Set(HeaderSignature, Signature(a.secret, a.body))
		req.Header.Set(HeaderWebhookSignature, StandardSignature(a.secret, a.eventKey, now, a.body))
	}

	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		elapsed := time.Since(start)
		switch {
		case ctx.Err() != nil:
			return response{result: resultAbandoned, elapsed: elapsed}
		case errors.Is(err, ErrRefused):
			var re *RefusedError
			errors.As(err, &re)
			return response{result: resultRefused, message: re.Error(), elapsed: elapsed}
		case errors.Is(reqCtx.Err(), context.DeadlineExceeded):
			return response{result: resultFailed, elapsed: elapsed,
				message: fmt.Sprintf("no answer within %s", timeout)}
		default:
			return response{result: resultFailed, message: err.Error(), elapsed: elapsed}
		}
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyBytes))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainBytes))
	_ = resp.Body.Close()
	elapsed := time.Since(start)
	if ctx.Err() != nil {
		// The answer may be complete, but the outcome cannot be recorded
		// any more; the next holder resends after the claim expires.
		return response{result: resultAbandoned, status: resp.StatusCode, elapsed: elapsed}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return response{result: resultDelivered, status: resp.StatusCode, elapsed: elapsed}
	}
	// A 429 or 503 says when the receiver can take the delivery (RFC 9110
	// §15.5.20, §15.6.4): the next attempt waits at least that long.
	hold, _ := outbound.RetryRefusal(resp, clock())
	hold = min(hold, maxReceiverRetryAfter)
	msg := fmt.Sprintf("HTTP %d", resp.StatusCode)
	if loc := resp.Header.Get("Location"); loc != "" && resp.StatusCode >= 300 && resp.StatusCode < 400 {
		msg += " (redirect to " + loc + " not followed)"
	}
	if s := printable(snippet); s != "" {
		msg += ": " + s
	}
	if hold > 0 {
		msg += fmt.Sprintf(" (asked to retry after %s)", hold)
	}
	return response{result: resultFailed, status: resp.StatusCode, message: msg, elapsed: elapsed, retryAfter: hold}
}

// printable trims a response body excerpt to valid, single-line UTF-8.
func printable(b []byte) string {
	for len(b) > 0 && !utf8.Valid(b) {
		b = b[:len(b)-1]
	}
	// Control characters (a NUL among them, which the database refuses)
	// count as white space.
	return strings.Join(strings.FieldsFunc(string(b), func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }), " ")
}
