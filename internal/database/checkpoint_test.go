package database

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// A live writer's log is copied and started over by the checkpointer,
// not by the writer's next commit: once the writes stop, a log longer
// than restartFrames (and shorter than wal_autocheckpoint, which the
// writer's commits would meet) is started over with no write of the
// test's; the checkpointer's own write leaves a frame or a few.
func TestALongLogIsCopiedAndStartedOverInTheBackground(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	db := openTemp(t, path)
	ctx := context.Background()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// A checkpointer that looks every 2 ms instead of checkpointEvery.
	db.ckpt.close(closeWait)
	db.ckpt = startCheckpointer(db.DB, path, 2*time.Millisecond)
	if _, err := db.ExecContext(ctx, `CREATE TABLE rows (v BLOB)`); err != nil {
		t.Fatal(err)
	}
	shm := path + "-shm"
	long := uint32(restartFrames + 50)
	var frames uint32
	for frames < long {
		if _, err := db.ExecContext(ctx, `INSERT INTO rows VALUES (randomblob(3000))`); err != nil {
			t.Fatal(err)
		}
		var ok bool
		if frames, ok = walIndexHeader(shm); !ok {
			t.Fatalf("no wal-index header at %s", shm)
		}
	}
	if frames >= 1000 {
		t.Fatalf("the log reached %d frames: the commits met wal_autocheckpoint", frames)
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		now, _ := walIndexHeader(shm)
		if now < restartFrames {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log still holds %d frames 10 s after the writes stopped at %d", now, frames)
		}
		<-tick.C
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM rows`).Scan(&n); err != nil || n == 0 {
		t.Fatalf("rows after the log started over: %d, %v", n, err)
	}
}

func TestACheckpointRoundRunsOnALongLogThatGrewLittle(t *testing.T) {
	for _, c := range []struct {
		frames, last uint32
		want         bool
		why          string
	}{
		{0, 0, false, "no log"},
		{restartFrames - 1, 0, false, "short"},
		{restartFrames, 1, true, "long, grew by restartFrames - 1"},
		{restartFrames + 10, 10, false, "grew by restartFrames within a tick: a catch-up"},
		{400, 300, true, "long, grew by 100"},
		{400, 400, true, "long, nothing written"},
		{2000, 1000, false, "grew by 1000 within a tick: a catch-up"},
		{200, 5000, false, "started over since, short"},
		{300, 5000, false, "started over since and grew by 300"},
	} {
		if got := due(c.frames, c.last); got != c.want {
			t.Errorf("due(%d, %d) = %v, want %v (%s)", c.frames, c.last, got, c.want, c.why)
		}
	}
}

func TestCloseStopsTheCheckpointer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	db := openTemp(t, path)
	c := db.ckpt
	if c == nil {
		t.Fatal("a writable file database has no checkpointer")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	default:
		t.Fatal("the checkpointer still runs after Close")
	}
}
