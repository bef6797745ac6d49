package database

import (
	"context"
	"database/sql/driver"
	"path/filepath"
	"testing"
	"time"
)

// logFrames is the write-ahead log's length in frames and how many of
// them are in the database, as a PASSIVE checkpoint on a pool connection
// finds them (it copies what it can first).
func logFrames(t *testing.T, db *DB) (frames, copied int64) {
	t.Helper()
	var busy int64
	if err := db.QueryRow("PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied); err != nil {
		t.Fatal(err)
	}
	return frames, copied
}

// fillLog writes n frames' worth of rows (one page each).
func fillLog(t *testing.T, db *DB, n int) {
	t.Helper()
	if _, err := db.Exec("CREATE TABLE IF NOT EXISTS filler (b BLOB)"); err != nil {
		t.Fatal(err)
	}
	for range n / 10 {
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		for range 10 {
			if _, err := tx.Exec("INSERT INTO filler VALUES (randomblob(3500))"); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

func checkpointConnOf(t *testing.T, db *DB) driver.Conn {
	t.Helper()
	conn, err := db.checkpointConn()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// A commit of the pool copies the log into the database only once it is
// far longer than the background checkpoints let it grow, on a writable
// file database; a read-only pool leaves SQLite's setting alone.
func TestPoolConnectionsCheckpointOnlyALongLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	db := openTemp(t, path)
	var pages int
	if err := db.QueryRow("PRAGMA wal_autocheckpoint").Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if pages != 4000 {
		t.Fatalf("wal_autocheckpoint = %d on a pool connection, want 4000", pages)
	}
	ro, err := Open(context.Background(), Options{URL: "file:" + path, BusyTimeout: time.Second, ReadOnly: true, MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := ro.QueryRow("PRAGMA wal_autocheckpoint").Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if pages != 1000 {
		t.Fatalf("wal_autocheckpoint = %d on a read-only pool, want SQLite's 1000", pages)
	}
	if ro.stopCheckpoints != nil {
		t.Fatal("a read-only database runs background checkpoints")
	}
}

// A complete checkpoint of a long log starts it again from its beginning,
// so the log stays about one interval of writes long.
func TestACheckpointOfALongLogStartsItAgain(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	conn := checkpointConnOf(t, db)
	fillLog(t, db, restartFrames+200)
	if err := checkpoint(conn); err != nil {
		t.Fatal(err)
	}
	fillLog(t, db, 10)
	if frames, _ := logFrames(t, db); frames > 20 {
		t.Fatalf("the log holds %d frames after a restart and 10 more rows, want the new rows' only", frames)
	}
}

// Under steady writes a commit nearly always lands while a checkpoint
// syncs the database, and SQLite then never starts the log again by
// itself (only a write whose transaction began after a complete
// checkpoint does): the checkpoints must, or the log grows without bound.
func TestTheLogStaysShortUnderSteadyWrites(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	conn := checkpointConnOf(t, db)
	fillLog(t, db, 10)
	stop, done := make(chan struct{}), make(chan error)
	go func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- nil
				return
			case <-tick.C:
			}
			if _, err := db.Exec("INSERT INTO filler VALUES (randomblob(3500)), (randomblob(3500)), (randomblob(3500))"); err != nil {
				done <- err
				return
			}
		}
	}()
	var longest int64
	tick := time.NewTicker(20 * time.Millisecond)
	for range 50 {
		<-tick.C
		if err := checkpoint(conn); err != nil {
			t.Fatal(err)
		}
		var busy, frames, copied int64
		if err := db.QueryRow("PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied); err != nil {
			t.Fatal(err)
		}
		longest = max(longest, frames)
	}
	tick.Stop()
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var rows int64
	if err := db.QueryRow("SELECT count(*) FROM filler").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if longest > 3*restartFrames {
		t.Fatalf("the log reached %d frames (%d rows written), want it started again near %d", longest, rows, restartFrames)
	}
}

// The checkpoints never wait for a lock: with a write transaction open
// and a reader on an older snapshot, a checkpoint returns at once, and
// the log is started again once they are gone.
func TestACheckpointNeitherWaitsForNorBlocksOthers(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	conn := checkpointConnOf(t, db)
	fillLog(t, db, restartFrames+200)

	reader, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := reader.QueryRow("SELECT count(*) FROM filler").Scan(&n); err != nil {
		t.Fatal(err)
	}
	fillLog(t, db, 20) // the reader's snapshot is now older than the log
	writer, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec("INSERT INTO filler VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := checkpoint(conn); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > time.Second {
		t.Fatalf("checkpoint took %v beside a writer and a reader: it waited for a lock", took)
	}
	if err := writer.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := reader.Rollback(); err != nil {
		t.Fatal(err)
	}
	if frames, _ := logFrames(t, db); frames < restartFrames {
		t.Fatalf("the log was started again (%d frames) under a reader of an older snapshot", frames)
	}

	if err := checkpoint(conn); err != nil {
		t.Fatal(err)
	}
	fillLog(t, db, 10)
	if frames, _ := logFrames(t, db); frames > 20 {
		t.Fatalf("the log holds %d frames once the reader had gone, want it started again", frames)
	}
}
