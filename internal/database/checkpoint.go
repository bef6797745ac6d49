package database

import (
	"context"
	"database/sql/driver"
	"time"
)

// checkpointEvery is how often a writable file database's write-ahead log
// is checkpointed in the background (checkpoints).
const checkpointEvery = time.Second

// restartFrames is the log length, in frames (pages), from which a
// complete checkpoint also starts the log again from its beginning.
const restartFrames = 1000

// commitCheckpoint is run on every writable file connection of the pool:
// a commit checkpoints the log itself only once it is 4,000 frames long
// (SQLite's default is 1,000). The commit that does copies the log into
// the database and syncs both, 10 to 40 ms on a 2-core VM, which was most
// of the freshness p99 (docs/performance.md): checkpoints does it beside
// the commits, and restarts the log near 1,000 frames, so under live
// traffic no commit checkpoints. While the consumer catches up it writes
// back to back, the background RESTART rarely finds the write lock free,
// and the commits keep the log bounded as SQLite always did.
const commitCheckpoint = "PRAGMA wal_autocheckpoint = 4000"

// checkpoints checkpoints the log every checkpointEvery until stop
// closes, then closes its connection and done. It has a native connection
// of its own, outside the pool, with busy_timeout 0: it never waits for a
// lock, and what it cannot do now it does on the next tick.
//
// Each tick runs a PASSIVE checkpoint
// (https://sqlite.org/pragma.html#pragma_wal_checkpoint): it takes no
// lock a reader or writer waits for, copies into the database the frames
// no reader still needs and syncs it. Once that has copied the whole log
// and the log is restartFrames long or more, a RESTART checkpoint starts
// the log again from its beginning. It holds the write lock only for the
// frames committed since the last PASSIVE one, and gives up at once when
// another connection writes or reads an older snapshot. (SQLite restarts
// the log itself only in a write whose transaction began after a complete
// checkpoint; under steady writes one nearly always began during it, and
// the log grew until a commit checkpointed it.)
//
// Every instance on the file runs its own; two at once take turns (the
// second one is answered "busy"). A failed checkpoint is left to the next
// tick, on a new connection: a database that cannot checkpoint fails the
// writes the workers report too. SQLite still checkpoints the log when
// the last connection to the file closes.
func (db *DB) checkpoints(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	var conn driver.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if conn == nil {
			var err error
			if conn, err = db.checkpointConn(); err != nil {
				conn = nil
				continue
			}
		}
		if err := checkpoint(conn); err != nil {
			_ = conn.Close()
			conn = nil
		}
	}
}

// checkpointConn opens the checkpoints' own connection: a pool
// connection's settings, then busy_timeout 0.
func (db *DB) checkpointConn() (driver.Conn, error) {
	ctx := context.Background()
	conn, err := db.connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := firstRow(ctx, conn, "PRAGMA busy_timeout = 0"); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

// checkpoint runs one tick's checkpoints on conn (see checkpoints).
func checkpoint(conn driver.Conn) error {
	ctx := context.Background()
	row, err := firstRow(ctx, conn, "PRAGMA wal_checkpoint(PASSIVE)")
	if err != nil {
		return err
	}
	// busy, frames in the log, frames copied into the database.
	var busy, frames, copied int64 = 1, 0, -1
	if len(row) == 3 {
		busy, _ = row[0].(int64)
		frames, _ = row[1].(int64)
		copied, _ = row[2].(int64)
	}
	if busy != 0 || frames < restartFrames || copied != frames {
		return nil
	}
	// A second PASSIVE one copies, without a lock, what was committed
	// while the first one synced the database, so that RESTART has next to
	// nothing to copy and sync while it holds the write lock.
	for _, mode := range []string{"PASSIVE", "RESTART"} {
		if _, err := firstRow(ctx, conn, "PRAGMA wal_checkpoint("+mode+")"); err != nil {
			return err
		}
	}
	return nil
}
