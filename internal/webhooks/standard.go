package webhooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks headers (https://www.standardwebhooks.com),
// sent with every delivery beside the X-Appview-* headers of docs/spec.md §9.
const (
	// HeaderWebhookID is the message id: the event key, the same on every
	// attempt, so a receiver can drop a delivery it already processed.
	HeaderWebhookID = "webhook-id"
	// HeaderWebhookTimestamp is the attempt's time in Unix seconds; it is
	// signed, so a receiver can refuse a captured delivery replayed later.
	HeaderWebhookTimestamp = "webhook-timestamp"
	// HeaderWebhookSignature is "v1,<base64 HMAC-SHA256 of id.timestamp.body>"
	// when the webhook has a secret.
	HeaderWebhookSignature = "webhook-signature"
)

// SecretPrefix marks a secret in the Standard Webhooks form: "whsec_"
// followed by the base64 of the key bytes.
const SecretPrefix = "whsec_"

// signingKey is the HMAC key of the Standard Webhooks signature for
// secret: the decoded bytes of a "whsec_" secret, otherwise the secret's
// own bytes (a receiver then uses the raw secret as the key). Check
// refuses a "whsec_" secret whose rest is not base64, so the fallback to
// raw bytes only covers rows stored before that check.
func signingKey(secret string) []byte {
	if rest, ok := strings.CutPrefix(secret, SecretPrefix); ok {
		if key, err := base64.StdEncoding.DecodeString(rest); err == nil && len(key) > 0 {
			return key
		}
	}
	return []byte(secret)
}

// StandardSignature is the webhook-signature value for a delivery with
// message id, attempt time ts and body under secret:
// "v1," + base64(HMAC-SHA256(key, id + "." + unix seconds + "." + body)).
func StandardSignature(secret, id string, ts time.Time, body []byte) string {
	mac := hmac.New(sha256.New, signingKey(secret))
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(strconv.FormatInt(ts.Unix(), 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// checkSecret refuses a "whsec_" secret that a Standard Webhooks receiver
// could not decode: its rest must be non-empty standard base64.
func checkSecret(secret string) error {
	rest, ok := strings.CutPrefix(secret, SecretPrefix)
	if !ok {
		return nil
	}
	key, err := base64.StdEncoding.DecodeString(rest)
	if err != nil || len(key) == 0 {
		return invalid("secret starts with %q but the rest is not base64 key bytes (Standard Webhooks form whsec_<base64>)", SecretPrefix)
	}
	return nil
}
