package billing

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/atproto"
)

// Tier is a user's billing tier.
type Tier struct {
	// Name is the billing source's name for the tier (informational).
	Name string
	// Rank orders tiers (0 is the lowest); holds map it to quotas.
	Rank int
}

// Source reads the tier of every user who has one.
type Source interface {
	// Tiers returns user DID → tier for every current subscriber. Users
	// absent from the map have no subscription.
	Tiers(ctx context.Context) (map[string]Tier, error)
}

// Metadata keys the Stripe source reads (see the package comment).
const (
	MetadataDID      = "did"
	MetadataTierRank = "tier_rank"
	MetadataTier     = "tier"
)

// stripeStatuses are the subscription statuses that confer a tier.
var stripeStatuses = []string{"active", "trialing"}

const (
	stripePageSize = 100
	// stripeMaxPages bounds one listing (10 000 pages of 100) so a server
	// that always says has_more cannot keep a round going forever.
	stripeMaxPages = 10000
	maxStripeBody  = 16 << 20
	// skippedShown is how many skipped subscription ids one warning names.
	skippedShown = 5
)

// Stripe is the production Source: the Stripe subscriptions API.
type Stripe struct {
	// BaseURL is billing.stripe_api_url, e.g. https://api.stripe.com.
	BaseURL string
	// SecretKey is billing.stripe_secret_key (sent as a Bearer token; never logged).
	SecretKey string
	// HTTP sends the requests; it should carry a timeout (billing.timeout).
	HTTP *http.Client
	// Log receives one warning per listing that skipped subscriptions.
	Log zerolog.Logger
}

type stripeList struct {
	Data    []stripeSubscription `json:"data"`
	HasMore bool                 `json:"has_more"`
}

type stripeSubscription struct {
	ID       string            `json:"id"`
	Status   string            `json:"status"`
	Metadata map[string]string `json:"metadata"`
	// Customer is an id, or the customer object when expanded.
	Customer json.RawMessage `json:"customer"`
	Items    struct {
		Data []struct {
			Price struct {
				ID       string            `json:"id"`
				Metadata map[string]string `json:"metadata"`
			} `json:"price"`
		} `json:"data"`
	} `json:"items"`
}

type stripeCustomer struct {
	ID       string            `json:"id"`
	Metadata map[string]string `json:"metadata"`
}

// Tiers lists active and trialing subscriptions and maps them to tiers.
// It returns an error if any page cannot be read (so a partial listing
// never looks like cancelled subscriptions).
func (s *Stripe) Tiers(ctx context.Context) (map[string]Tier, error) {
	out := map[string]Tier{}
	var skipped []string
	for _, status := range stripeStatuses {
		after := ""
		// seen holds every starting_after of this listing: a page whose
		// last id was already a starting_after does not advance, and
		// asking again would only be answered the same (stripeMaxPages
		// bounds the set).
		seen := map[string]bool{}
		for page := 0; ; page++ {
			if page == stripeMaxPages {
				return nil, fmt.Errorf("stripe: more than %d pages of %s subscriptions", stripeMaxPages, status)
			}
			list, err := s.page(ctx, status, after)
			if err != nil {
				return nil, err
			}
			for _, sub := range list.Data {
				did, tier, ok := subscriptionTier(sub)
				if !ok {
					skipped = append(skipped, sub.ID)
					continue
				}
				if have, dup := out[did]; !dup || tier.Rank > have.Rank {
					out[did] = tier
				}
			}
			if !list.HasMore {
				break
			}
			if len(list.Data) == 0 {
				return nil, fmt.Errorf("stripe: %s subscriptions: has_more with an empty page", status)
			}
			after = list.Data[len(list.Data)-1].ID
			if seen[after] {
				return nil, fmt.Errorf("stripe: %s subscriptions: page %d does not advance (has_more with starting_after %q again)",
					status, page+1, after)
			}
			seen[after] = true
		}
	}
	if len(skipped) > 0 {
		s.Log.Warn().Str("event", "billing.subscriptions_skipped").Int("count", len(skipped)).
			Strs("examples", skipped[:min(len(skipped), skippedShown)]).
			Msgf("subscriptions without a %q metadata DID or a price with %q metadata were skipped", MetadataDID, MetadataTierRank)
	}
	return out, nil
}

func (s *Stripe) page(ctx context.Context, status, after string) (*stripeList, error) {
	q := url.Values{}
	q.Set("status", status)
	q.Set("limit", strconv.Itoa(stripePageSize))
	q.Add("expand[]", "data.customer")
	if after != "" {
		q.Set("starting_after", after)
	}
	u := strings.TrimRight(s.BaseURL, "/") + "/v1/subscriptions?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("stripe: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+s.SecretKey)
	client := s.HTTP
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("stripe: list %s subscriptions: %w", status, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxStripeBody))
	if err != nil {
		return nil, fmt.Errorf("stripe: list %s subscriptions: read: %w", status, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		_ = atproto.Unmarshal(body, &e)
		return nil, fmt.Errorf("stripe: list %s subscriptions: HTTP %d: %s %s",
			status, resp.StatusCode, e.Error.Type, e.Error.Message)
	}
	var list stripeList
	if err := atproto.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("stripe: list %s subscriptions: decode: %w", status, err)
	}
	return &list, nil
}

// subscriptionTier applies the metadata mapping to one subscription.
func subscriptionTier(sub stripeSubscription) (string, Tier, bool) {
	did := sub.Metadata[MetadataDID]
	if did == "" && bytes.HasPrefix(bytes.TrimSpace(sub.Customer), []byte("{")) {
		var c stripeCustomer
		if atproto.Unmarshal(sub.Customer, &c) == nil {
			did = c.Metadata[MetadataDID]
		}
	}
	did = strings.TrimSpace(did)
	if _, err := syntax.ParseDID(did); err != nil {
		return "", Tier{}, false
	}
	best, found := Tier{}, false
	for _, item := range sub.Items.Data {
		rank, err := strconv.Atoi(strings.TrimSpace(item.Price.Metadata[MetadataTierRank]))
		if err != nil || rank < 0 {
			continue
		}
		if !found || rank > best.Rank {
			best, found = Tier{Name: item.Price.Metadata[MetadataTier], Rank: rank}, true
		}
	}
	return did, best, found
}
