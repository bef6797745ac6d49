package database

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Background checkpoints keep the write-ahead log's upkeep out of a live
// writer's commits.
//
// SQLite copies the log back into the database file (a checkpoint: the
// copy and two fsyncs) in the commit that takes the log past
// wal_autocheckpoint pages (1000), before that commit returns; and the
// first commit after a complete checkpoint starts the log over, which
// fsyncs its header (synchronous = NORMAL). A consumer's commit of one
// live event that meets either waits for the disk (up to tens of
// milliseconds on a busy one), and the frames read meanwhile wait behind
// it.
//
// So a writable file database has a checkpointer. Every checkpointEvery
// it reads the log's length from the wal-index header (walIndexHeader).
// Once the log holds restartFrames or more and grew by fewer within the
// tick, it makes a PASSIVE checkpoint, which takes no lock a writer needs
// and waits for none, and, when that copied the whole log and nothing was
// written since, a write that changes nothing (startOver) and starts the
// log over, paying the header's fsync. A live writer then meets the disk only when
// it collides with that write. A writer catching up (the log growing by
// restartFrames or more a tick) is left alone: its commits checkpoint at
// wal_autocheckpoint, as SQLite's do by default, so the log stays bounded
// either way. A short log is left alone too: an idle database, or one
// whose log another instance's checkpointer has just started over, costs
// one read of the header a tick.
const (
	// checkpointEvery is how often the checkpointer reads the log's length.
	checkpointEvery = 250 * time.Millisecond
	// restartFrames is the log length at which the checkpointer copies
	// the log and starts it over: well below wal_autocheckpoint (1000),
	// well above the frames its own write adds.
	restartFrames = 256
)

// checkpointer runs the background checkpoints of one DB.
type checkpointer struct {
	pool    *sql.DB
	shm     string // the wal-index, PATH-shm
	stop    chan struct{}
	done    chan struct{}
	stopped sync.Once
}

// startCheckpointer checkpoints the log of the database at path, through
// pool, looking every interval, until close.
func startCheckpointer(pool *sql.DB, path string, interval time.Duration) *checkpointer {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	c := &checkpointer{pool: pool, shm: path + "-shm", stop: make(chan struct{}), done: make(chan struct{})}
	go c.run(interval)
	return c
}

func (c *checkpointer) run(interval time.Duration) {
	defer close(c.done)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var last uint32 // the log's length at the previous tick
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		select {
		case <-c.stop: // both were ready: stopping wins
			return
		default:
		}
		frames, ok := walIndexHeader(c.shm)
		if !ok {
			continue
		}
		if due(frames, last) {
			c.round()
		}
		last = frames
	}
}

// due says whether a tick that finds frames in the log, after last at the
// tick before, runs a round: when the log is long and grew by fewer than
// restartFrames. A log that grew by more has a writer that is catching
// up, whose commits checkpoint as they always did, without the
// checkpointer taking the lock and the disk between them.
func due(frames, last uint32) bool {
	grew := frames - last
	if frames < last {
		grew = frames // started over since
	}
	return frames >= restartFrames && grew < restartFrames
}

// round copies the log and, when it copied all of it and nothing was
// written since, starts it over. An error (a replaced file, a full disk)
// is left to the writers to meet and report: their commits still
// checkpoint past wal_autocheckpoint.
func (c *checkpointer) round() {
	ctx := context.Background()
	var busy, logged, copied int
	if err := c.pool.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &logged, &copied); err != nil {
		return
	}
	// Only a log that was copied whole and has not grown since is
	// started over by the next write: under a writer that goes on (a
	// catch-up) the write would only add a frame, and take the write
	// lock between two of its transactions.
	if now, ok := walIndexHeader(c.shm); busy == 0 && logged > 0 && copied == logged && ok && int(now) == logged {
		c.startOver(ctx)
	}
}

// startOver writes the database's user_version with the value it has:
// nothing changes, but the page that holds it is written (SQLite writes
// the header page whenever the value is set, where an UPDATE that leaves
// a row as it was writes nothing), so this is the first commit after the
// checkpoint and starts the log over. Another writer's commit in between
// (it started the log over itself) makes the write fail, which is left
// at that.
func (c *checkpointer) startOver(ctx context.Context) {
	tx, err := c.pool.BeginTx(ctx, nil)
	if err != nil {
		return
	}
	defer func() { _ = tx.Rollback() }()
	var v int64
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v)); err != nil {
		return
	}
	_ = tx.Commit()
}

// walIndexVersion is the wal-index format this reads
// (https://sqlite.org/walformat.html, "The WAL-Index Header").
const walIndexVersion = 3007000

// walIndexHeader reads the number of frames in the log (mxFrame) from the
// wal-index header, in the host's byte order. SQLite keeps the header in
// shared memory mapped from the file, so a read may race a writer: the
// number only decides whether a round is worth running. ok is false when
// there is no wal-index or it is not of a format this reads.
func walIndexHeader(shm string) (frames uint32, ok bool) {
	f, err := os.Open(shm)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var h [20]byte
	if _, err := f.ReadAt(h[:], 0); err != nil {
		return 0, false
	}
	if binary.NativeEndian.Uint32(h[0:4]) != walIndexVersion {
		return 0, false
	}
	return binary.NativeEndian.Uint32(h[16:20]), true
}

// close stops the checkpoints and returns once none runs, or after wait
// when one is stuck in the driver (Close then reports the connection
// still busy).
func (c *checkpointer) close(wait time.Duration) {
	c.stopped.Do(func() { close(c.stop) })
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
	}
}
