package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

// jetstream.collections takes every NSID the specification does (so the
// config never refuses a collection Jetstream accepts) and none it refuses.
func TestCollectionsFollowTheSpecificationsTestVectors(t *testing.T) {
	withCollection := func(col string) error {
		c := Default()
		c.Jetstream.Collections = []string{col}
		return c.Validate()
	}
	for _, col := range testsupport.ValidVectors(testsupport.SyntaxNSID) {
		if err := withCollection(col); err != nil {
			t.Errorf("collection %q refused, the specification says valid: %v", col, err)
		}
	}
	for _, col := range testsupport.InvalidVectors(testsupport.SyntaxNSID) {
		if strings.HasSuffix(col, ".*") {
			continue // not an NSID, but a wildcard Jetstream takes
		}
		var cerr *Error
		if err := withCollection(col); !errors.As(err, &cerr) || cerr.Key != "jetstream.collections" {
			t.Errorf("collection %q: %v, want a refusal naming jetstream.collections", col, err)
		}
	}
}
