package backfill

import (
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

// listRecords URIs are checked by the AT-URI syntax: every spec-invalid
// URI is skipped, every spec-valid record URI is taken.
func TestRecordURIsFollowTheSpecificationsTestVectors(t *testing.T) {
	taken := 0
	for _, uri := range testsupport.ValidVectors(testsupport.SyntaxATURI) {
		parts := strings.Split(strings.TrimPrefix(uri, "at://"), "/")
		if len(parts) != 3 {
			if _, err := rkeyOf(uri, parts[0], ""); err == nil {
				t.Errorf("rkeyOf(%q) took a URI that names no record", uri)
			}
			continue
		}
		taken++
		if rkey, err := rkeyOf(uri, parts[0], parts[1]); err != nil || rkey != parts[2] {
			t.Errorf("rkeyOf(%q) = %q, %v; the specification says valid", uri, rkey, err)
		}
	}
	if taken == 0 {
		t.Fatal("no record URI among the vectors: the test checks nothing")
	}
	for _, uri := range testsupport.InvalidVectors(testsupport.SyntaxATURI) {
		parts := strings.Split(strings.TrimPrefix(uri, "at://"), "/")
		if len(parts) != 3 {
			continue // refused for its shape before and after
		}
		if rkey, err := rkeyOf(uri, parts[0], parts[1]); err == nil {
			t.Errorf("rkeyOf(%q) = %q, the specification says invalid", uri, rkey)
		}
	}
}
