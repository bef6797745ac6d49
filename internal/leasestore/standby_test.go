package leasestore_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/leasestore"
	"github.com/atcr-io/appview/internal/testsupport"
)

func TestStandbyURLSitsBesideTheNudgeEndpoint(t *testing.T) {
	for _, tc := range []struct {
		nudge, want string
		ok          bool
	}{
		{"http://10.0.0.7:5001/lease/nudge", "http://10.0.0.7:5001/lease/standby", true},
		{"http://h:5001/admin/lease/nudge", "http://h:5001/admin/lease/standby", true},
		{"http://h:5001/lease/nudge/", "", false},
		{"http://h:5001/nudge", "", false},
	} {
		got, ok := leasestore.StandbyURL(tc.nudge)
		if got != tc.want || ok != tc.ok {
			t.Errorf("StandbyURL(%q) = %q, %v; want %q, %v", tc.nudge, got, ok, tc.want, tc.ok)
		}
	}
}

// standbyTarget is a contender's admin endpoint that records, in order,
// the paths POSTed to it with their lease parameter and Authorization,
// and the remote address of each (one per connection).
type standbyTarget struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []string // "path lease authorization"
	rem []string
	// hold, when not nil, keeps standby requests unanswered until closed.
	hold chan struct{}
}

func newStandbyTarget(t *testing.T, hold chan struct{}) *standbyTarget {
	t.Helper()
	s := &standbyTarget{hold: hold}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.got = append(s.got, r.URL.Path+" "+r.URL.Query().Get("lease")+" "+r.Header.Get("Authorization"))
		s.rem = append(s.rem, r.RemoteAddr)
		s.mu.Unlock()
		if r.URL.Path == leasestore.StandbyPath {
			if s.hold != nil {
				<-s.hold
			}
			w.WriteHeader(http.StatusAccepted)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *standbyTarget) requests() ([]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...), append([]string(nil), s.rem...)
}

// An announced release reaches every known contender's standby endpoint,
// named and authorised like a nudge, before Announce returns; the nudge
// after the release then goes on the same connection.
func TestAnnounceReachesTheContendersBeforeItReturnsAndTheNudgeFollowsOnItsConnection(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	target := newStandbyTarget(t, nil)
	register(t, db, "cleanup", "c", "n-c", target.srv.URL+leasestore.NudgePath)
	h := preparedHolder(t, db, "cleanup")
	h.Header = http.Header{"Authorization": {"Bearer s3cret"}}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.Announce(ctx, "cleanup")
	got, _ := target.requests()
	if len(got) != 1 || got[0] != "/lease/standby cleanup Bearer s3cret" {
		t.Fatalf("requests when Announce returned: %q; want the standby, named and authorised", got)
	}
	h.NudgeOthers("cleanup")
	h.Wait()
	got, rem := target.requests()
	if len(got) != 2 || got[1] != "/lease/nudge cleanup Bearer s3cret" {
		t.Fatalf("requests: %q; want the standby, then the nudge", got)
	}
	if rem[0] != rem[1] {
		t.Errorf("the nudge came from %s, the standby from %s: want the connection dialed ahead for both", rem[1], rem[0])
	}
}

// With NoAnnounce (a libSQL server: contenders do not stand by), Announce
// sends nothing.
func TestNoAnnounceSendsNothing(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	target := newStandbyTarget(t, nil)
	register(t, db, "cleanup", "c", "n-c", target.srv.URL+leasestore.NudgePath)
	h := preparedHolder(t, db, "cleanup")
	h.NoAnnounce = true
	h.Announce(context.Background(), "cleanup")
	h.Wait()
	if got, _ := target.requests(); len(got) != 0 {
		t.Fatalf("requests with NoAnnounce: %q", got)
	}
}

// A contender that does not answer holds the release back no longer than
// the holder's context allows.
func TestAnnounceWaitsForASilentContenderOnlyUntilItsContextEnds(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	hold := make(chan struct{})
	target := newStandbyTarget(t, hold)
	defer close(hold) // before the server's Close (cleanup) waits for the handler
	register(t, db, "cleanup", "c", "n-c", target.srv.URL+leasestore.NudgePath)
	h := preparedHolder(t, db, "cleanup")

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	h.Announce(ctx, "cleanup")
	// The connection's deadline is the context's (its own timer may set
	// ctx.Err a moment later).
	if now := time.Now(); now.Before(deadline) {
		t.Fatalf("Announce returned %v before its context's deadline, the contender silent", deadline.Sub(now))
	}
	testsupport.Eventually(t, "the standby request received", func() bool {
		got, _ := target.requests()
		return len(got) == 1
	})
	h.Wait()
}

// A contender whose nudge URL has another shape, or that answers 404 (an
// older instance without the endpoint), is only nudged.
func TestAnnounceSkipsNudgeURLsOfAnotherShapeAndToleratesA404(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	odd := newStandbyTarget(t, nil)
	old := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(old.Close)
	register(t, db, "backfill", "odd", "n-odd", odd.srv.URL+"/nudge-me")
	register(t, db, "backfill", "old", "n-old", old.URL+leasestore.NudgePath)
	h := holderContenders(db)
	h.Prepare("backfill")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.WaitPrepared(ctx, "backfill")
	h.Announce(ctx, "backfill")
	if got, _ := odd.requests(); len(got) != 0 {
		t.Errorf("a nudge URL not ending in %s got %q", leasestore.NudgePath, got)
	}
	h.NudgeOthers("backfill")
	h.Wait()
	if got, _ := odd.requests(); len(got) != 1 || got[0] != "/nudge-me backfill " {
		t.Errorf("requests to the odd URL: %q; want one nudge", got)
	}
}

// Watch reads what an acquire would find: no row, a live grant, a
// released one, one run out (on the database's clock); none of them is
// the reader's own.
func TestWatchReadsWhetherAnAcquireWouldFindTheLeaseFree(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	ctx := context.Background()
	s := leasestore.NewStore(db, time.Minute)
	check := func(what string, wantFree bool, wantFence int64) {
		t.Helper()
		v, err := s.Watch(ctx, "cleanup", "c")
		if err != nil || v.Free != wantFree || v.Fence != wantFence || v.Ours {
			t.Fatalf("%s: Watch = %+v, %v; want free %v, fence %d, not ours", what, v, err, wantFree, wantFence)
		}
	}
	check("no row", true, 0)
	g, err := s.Acquire(ctx, "cleanup", "a")
	if err != nil || !g.Granted {
		t.Fatal(g, err)
	}
	check("held", false, g.Fence)
	if err := s.Release(ctx, fence.Custody{Lease: "cleanup", Holder: "a", Fence: g.Fence}); err != nil {
		t.Fatal(err)
	}
	check("released", true, g.Fence)
	g2, err := s.Acquire(ctx, "cleanup", "b")
	if err != nil || !g2.Granted {
		t.Fatal(g2, err)
	}
	if _, err := db.Exec(`UPDATE leases SET expires_at = expires_at - 120000 WHERE name = 'cleanup'`); err != nil {
		t.Fatal(err)
	}
	check("run out", true, g2.Fence)
}

// A contender that takes the nudge's connection and never answers (a
// frozen process) holds a stopping holder no longer than Drain's grace;
// the nudge was written all the same.
func TestDrainGivesUpOnANudgeNeverAnswered(t *testing.T) {
	db := testsupport.OpenDB(t).DB
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	lines := make(chan string, 8)
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn)
			mu.Unlock()
			go func() {
				line, _ := bufio.NewReader(conn).ReadString('\n')
				lines <- line
			}()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	register(t, db, "cleanup", "frozen", "n-frozen", "http://"+ln.Addr().String()+leasestore.NudgePath)
	h := preparedHolder(t, db, "cleanup")
	h.NudgeOthers("cleanup")
	select {
	case line := <-lines:
		if !strings.HasPrefix(line, "POST /lease/nudge?lease=cleanup ") {
			t.Fatalf("the contender read %q, want the nudge", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the nudge was not written")
	}
	began := time.Now()
	h.Drain(50 * time.Millisecond)
	if took := time.Since(began); took >= leasestore.NudgeTimeout {
		t.Fatalf("Drain took %v: it waited for the unanswered nudge's own timeout (%v)", took, leasestore.NudgeTimeout)
	}
}
