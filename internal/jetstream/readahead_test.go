package jetstream

import (
	"reflect"
	"testing"
	"time"
)

// A batch closes once its frames reach BatchBytes, whatever BatchSize
// says: with a one-byte bound every batch is one frame, and the stream
// still arrives whole and in order.
func TestClientClosesABatchAtItsByteBound(t *testing.T) {
	want := captureEvents(t, "expected_v1.jsonl")
	srv := startReplay(t, ReplayOptions{})
	s := newSink()
	runClient(t, ClientOptions{URLs: []string{srv.URL()}, BatchSize: 1000, BatchBytes: 1}, s.handle)
	got := s.waitEvents(t, len(want))
	if !reflect.DeepEqual(got, want) {
		t.Fatal("delivered events differ from the capture")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, n := range s.batches {
		if n != 1 {
			t.Fatalf("batch %d holds %d frames; a one-byte bound closes every batch at its first frame", i, n)
		}
	}
}

// The read-ahead bound: frames fit while they stay under the limit; the
// next waits until the handler gives bytes back, or until the connection
// stops; a frame larger than the limit passes when nothing is held.
func TestReadAheadHoldsTheReaderAtItsLimit(t *testing.T) {
	r := newReadAhead(100)
	never := make(chan struct{})
	if !r.wait(60, never) || !r.wait(40, never) {
		t.Fatal("frames under the limit were held back")
	}
	passed := make(chan bool, 1)
	go func() { passed <- r.wait(10, never) }()
	select {
	case <-passed:
		t.Fatal("a frame past the limit passed while 100 bytes were held")
	case <-time.After(20 * time.Millisecond): // proving a negative: it must still be waiting
	}
	r.done(60)
	select {
	case ok := <-passed:
		if !ok {
			t.Fatal("wait gave up without a stop")
		}
	case <-time.After(testWait):
		t.Fatal("giving 60 bytes back did not let a 10-byte frame through")
	}
	if got := r.held.Load(); got != 50 {
		t.Fatalf("held %d bytes, want 50", got)
	}

	stop := make(chan struct{})
	go func() { passed <- r.wait(1000, stop) }()
	close(stop)
	if ok := <-passed; ok {
		t.Fatal("wait reported success after stop")
	}
	r.done(50)
	if !r.wait(1000, never) {
		t.Fatal("a frame larger than the limit did not pass with nothing held")
	}
}
