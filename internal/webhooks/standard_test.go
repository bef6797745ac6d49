package webhooks

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/atcr-io/appview/internal/config"
)

// whsecTest is a Standard Webhooks secret: whsec_ + base64 of 24 key bytes.
const whsecTest = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// TestDeliveriesVerifyWithTheStandardWebhooksReferenceLibrary sends real
// deliveries (a failed first attempt, then a retry) and verifies each
// with the specification's reference Go library, for a whsec_ secret and
// for a plain secret used as raw key bytes. The
// X-Appview-* headers of docs/spec.md §9 are still sent.
func TestDeliveriesVerifyWithTheStandardWebhooksReferenceLibrary(t *testing.T) {
	for _, tc := range []struct {
		name, secret string
		verifier     func() (*standardwebhooks.Webhook, error)
	}{
		{"whsec secret", whsecTest, func() (*standardwebhooks.Webhook, error) { return standardwebhooks.NewWebhook(whsecTest) }},
		{"plain secret", "plain-secret", func() (*standardwebhooks.Webhook, error) {
			return standardwebhooks.NewWebhookRaw([]byte("plain-secret"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			e := newEnv(t)
			rc := newReceiver(t, func(_ *http.Request, n int) int {
				if n == 1 {
					return http.StatusServiceUnavailable
				}
				return http.StatusOK
			})
			hook := e.addWebhook(rc.srv.URL, tc.secret)
			p := push("app", "sha256:aaa")
			e.enqueue(e.custody, p)
			e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true, RetrySchedule: []time.Duration{0, 50 * time.Millisecond}}, nil))
			e.waitStatus(hook, p.EventKey, "delivered")
			wh, err := tc.verifier()
			if err != nil {
				t.Fatal(err)
			}
			got := rc.requests()
			if len(got) != 2 {
				t.Fatalf("%d requests, want 2 (one retry)", len(got))
			}
			for i, r := range got {
				if err := wh.Verify(r.Body, r.Header); err != nil {
					t.Errorf("attempt %d does not verify: %v (headers %v)", i+1, err, r.Header)
				}
				if id := r.Header.Get(HeaderWebhookID); id != p.EventKey {
					t.Errorf("attempt %d: webhook-id = %q, want the event key %q (the same on every attempt)", i+1, id, p.EventKey)
				}
				if r.Header.Get(HeaderSignature) == "" || r.Header.Get(HeaderDelivery) != p.EventKey {
					t.Errorf("attempt %d lost the X-Appview-* headers: %v", i+1, r.Header)
				}
			}
			// A tampered body fails.
			if err := wh.Verify(append(got[0].Body, ' '), got[0].Header); !errors.Is(err, standardwebhooks.ErrNoMatchingSignature) {
				t.Errorf("tampered body: %v, want ErrNoMatchingSignature", err)
			}
		})
	}
}

// TestACapturedDeliveryReplayedOutsideTheToleranceIsRefused: a delivery
// signed six minutes ago (a capture replayed now) verifies as authentic
// but the reference library refuses it as too old (its tolerance is 5
// minutes): the timestamp is signed, so it cannot be refreshed.
func TestACapturedDeliveryReplayedOutsideTheToleranceIsRefused(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, nil)
	hook := e.addWebhook(rc.srv.URL, whsecTest)
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)
	captured := time.Now().Add(-6 * time.Minute)
	o := e.options(e.custody, config.Webhooks{AllowPrivate: true}, nil)
	o.Now = func() time.Time { return captured }
	e.spawn(o)
	e.waitStatus(hook, p.EventKey, "delivered")
	r := rc.requests()[0]
	wh, err := standardwebhooks.NewWebhook(whsecTest)
	if err != nil {
		t.Fatal(err)
	}
	if err := wh.VerifyIgnoringTimestamp(r.Body, r.Header); err != nil {
		t.Fatalf("the captured delivery is not authentic: %v", err)
	}
	if err := wh.Verify(r.Body, r.Header); !errors.Is(err, standardwebhooks.ErrMessageTooOld) {
		t.Fatalf("replay six minutes later: %v, want ErrMessageTooOld", err)
	}
	// Refreshing the timestamp breaks the signature.
	fresh := r.Header.Clone()
	fresh.Set(HeaderWebhookTimestamp, strconv.FormatInt(time.Now().Unix(), 10))
	if err := wh.Verify(r.Body, fresh); !errors.Is(err, standardwebhooks.ErrNoMatchingSignature) {
		t.Fatalf("replay with a fresh timestamp: %v, want ErrNoMatchingSignature", err)
	}
}

func TestStandardSignatureMatchesTheReferenceSigner(t *testing.T) {
	ts := time.Unix(1_700_000_000, 0)
	body := []byte(`{"a":1}`)
	wh, err := standardwebhooks.NewWebhook(whsecTest)
	if err != nil {
		t.Fatal(err)
	}
	want, err := wh.Sign("msg_1", ts, body)
	if err != nil {
		t.Fatal(err)
	}
	if got := StandardSignature(whsecTest, "msg_1", ts, body); got != want {
		t.Fatalf("StandardSignature = %s, reference = %s", got, want)
	}
}

func TestAWhsecSecretThatIsNotBase64IsRefused(t *testing.T) {
	_, err := Check(context.Background(), Webhook{DID: testOwner, URL: "http://127.0.0.1:9/x", Secret: "whsec_not base64!"}, Guard{AllowPrivate: true})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("Check(whsec_ with bad base64) = %v, want ErrInvalid", err)
	}
}
