package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/syntaxvectors"
)

// jetstream.collections takes every NSID the specification does (so the
// config never refuses a collection Jetstream accepts) and none it refuses.
func TestCollectionsFollowTheSpecificationsTestVectors(t *testing.T) {
	withCollection := func(col string) error {
		c := Default()
		c.Jetstream.Collections = []string{col}
		return c.Validate()
	}
	for _, col := range syntaxvectors.Valid(syntaxvectors.NSID) {
		if err := withCollection(col); err != nil {
			t.Errorf("collection %q refused, the specification says valid: %v", col, err)
		}
	}
	for _, col := range syntaxvectors.Invalid(syntaxvectors.NSID) {
		if strings.HasSuffix(col, ".*") {
			continue // not an NSID, but a wildcard Jetstream takes
		}
		var cerr *Error
		if err := withCollection(col); !errors.As(err, &cerr) || cerr.Key != "jetstream.collections" {
			t.Errorf("collection %q: %v, want a refusal naming jetstream.collections", col, err)
		}
	}
}
