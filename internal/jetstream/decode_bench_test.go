package jetstream

import (
	"testing"
)

// BenchmarkDecode measures decoding the 152 captured events, as text frames
// and as dictionary-compressed binary frames. MB/s is JSON throughput (the
// same bytes for both, so the two are comparable); ns/event and
// wire-B/event are per event.
func BenchmarkDecode(b *testing.B) {
	lines := captureLines(b, "expected_v1.jsonl")
	var jsonBytes int64
	frames := make([][]byte, len(lines))
	var wireCompressed int64
	for i, l := range lines {
		jsonBytes += int64(len(l))
		frames[i] = Compress(nil, l)
		wireCompressed += int64(len(frames[i]))
	}
	d := newTestDecoder(b, 0)
	for _, bc := range []struct {
		name       string
		compressed bool
		frames     [][]byte
		wire       int64
	}{
		{"raw", false, lines, jsonBytes},
		{"compressed", true, frames, wireCompressed},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(jsonBytes)
			b.ReportAllocs()
			for b.Loop() {
				for _, f := range bc.frames {
					if _, err := d.Decode(f, bc.compressed); err != nil {
						b.Fatal(err)
					}
				}
			}
			perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(perOp/float64(len(bc.frames)), "ns/event")
			b.ReportMetric(float64(bc.wire)/float64(len(bc.frames)), "wire-B/event")
		})
	}
}
