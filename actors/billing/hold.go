package billing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/outbound"
)

// UpdateCrewTierPath is the hold XRPC procedure the refresh calls (docs/lexicons.md).
const UpdateCrewTierPath = "/xrpc/io.atcr.hold.updateCrewTier"

// XRPC error names of updateCrewTier the refresh branches on.
const (
	ErrNameAuthRequired = "AuthRequired"
	ErrNameUserNotFound = "UserNotFound"
)

const maxHoldBody = 1 << 20

// XRPCError is a hold's non-2xx answer: {"error": Name, "message": Message}.
type XRPCError struct {
	// Status is the HTTP status code.
	Status int
	// Name is the XRPC error name ("" when the body had none).
	Name string
	// Message is the hold's explanation.
	Message string
}

func (e *XRPCError) Error() string {
	name := e.Name
	if name == "" {
		name = http.StatusText(e.Status)
	}
	if e.Message == "" {
		return fmt.Sprintf("hold XRPC error %s (HTTP %d)", name, e.Status)
	}
	return fmt.Sprintf("hold XRPC error %s (HTTP %d): %s", name, e.Status, e.Message)
}

// holdDown reports whether the error means the hold as a whole is not
// answering usefully (transport failure, 5xx, 408/429, a redirect, or a
// 4xx that is not an XRPC error at all, e.g. a proxy's page), so the rest
// of its members are not worth trying this round. A named XRPC 4xx is
// about one member.
func holdDown(err error) bool {
	var xe *XRPCError
	if !errors.As(err, &xe) {
		return true
	}
	return xe.Status >= 500 || xe.Status/100 == 3 || xe.Status == http.StatusRequestTimeout ||
		xe.Status == http.StatusTooManyRequests || xe.Name == ""
}

func xrpcName(err error) string {
	var xe *XRPCError
	if errors.As(err, &xe) {
		return xe.Name
	}
	return ""
}

// updateCrewTier POSTs {userDid, tierRank} to the hold at endpoint and
// returns the hold's tierName. Errors are *XRPCError for a non-2xx answer,
// otherwise transport or decoding errors.
func updateCrewTier(ctx context.Context, client *http.Client, endpoint, userDID string, rank int) (string, error) {
	body, _ := json.Marshal(struct {
		UserDID  string `json:"userDid"`
		TierRank int    `json:"tierRank"`
	}{userDID, rank})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		strings.TrimRight(endpoint, "/")+UpdateCrewTierPath, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	// A redirect is never followed: net/http turns a POST answered 301,
	// 302 or 303 into a bodyless GET, which a hold may answer 200 without
	// ever seeing the tier. The 3xx is an error (holdDown) and the push
	// is made again next interval.
	noRedirect := *client
	noRedirect.CheckRedirect = outbound.NoRedirect
	resp, err := noRedirect.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxHoldBody))
	if err != nil {
		return "", fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		xe := &XRPCError{Status: resp.StatusCode}
		var e struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		if atproto.Unmarshal(raw, &e) == nil {
			xe.Name, xe.Message = e.Error, e.Message
		}
		return "", xe
	}
	var out struct {
		TierName string `json:"tierName"`
	}
	if err := atproto.Unmarshal(raw, &out); err != nil {
		return "", fmt.Errorf("decode answer: %w", err)
	}
	return out.TierName, nil
}
