package lease

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

// An instance_id is the operator's to choose, and go-libsql hands a plain
// read of date-like TEXT back as RFC 3339: 2024-06-01 would be reported
// as 2024-06-01T00:00:00Z by a contender and by `appview leases`.
func TestADateLikeHolderIsReportedExactlyAsStored(t *testing.T) {
	const holder = "2024-06-01"
	path := filepath.Join(t.TempDir(), "appview.db")
	a, b := NewStore(testsupport.OpenDBAt(t, path), longTTL), NewStore(testsupport.OpenDBAt(t, path), longTTL)
	held := mustAcquire(t, a, "cleanup", holder)
	g, err := b.Acquire(context.Background(), "cleanup", "instance-b")
	if err != nil || g.Granted {
		t.Fatalf("contender got a held lease: %+v %v", g, err)
	}
	if g.Holder != holder {
		t.Fatalf("contender was told the holder is %q, want %q", g.Holder, holder)
	}
	if row := readRow(t, testsupport.OpenDBAt(t, path), "cleanup"); row.Holder != holder {
		t.Fatalf("List reports holder %q, want %q", row.Holder, holder)
	}
	if err := a.Renew(context.Background(), held); err != nil {
		t.Fatalf("renew by the date-like holder: %v", err)
	}
}
