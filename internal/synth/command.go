package synth

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/atcr-io/appview/internal/jetstream"
)

// Write streams the Options' events to w as Jetstream v1 JSONL (one event
// a line, time_us strictly increasing) and returns the expected state.
// Memory is bounded by the model (users × repositories), not by Events.
func Write(ctx context.Context, w io.Writer, o Options) (*Expected, error) {
	g := NewGenerator(o)
	if _, err := WriteEvents(ctx, w, g, nil, nil); err != nil {
		return nil, err
	}
	return g.Expected(), nil
}

// WriteEvents streams g's events to w as Jetstream v1 JSONL, keeping only
// the events keep accepts (nil keeps all) and passing each kept one to
// seen (nil: none) in stream order. It returns how many events it wrote;
// g.Expected() is the state of the whole stream, filtered or not.
func WriteEvents(ctx context.Context, w io.Writer, g *Generator, keep func(*jetstream.Event) bool, seen func(*jetstream.Event)) (int, error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	enc := json.NewEncoder(bw)
	n := 0
	for i := 0; ; i++ {
		if i%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return n, err
			}
		}
		ev, ok := g.Next()
		if !ok {
			break
		}
		if keep != nil && !keep(&ev) {
			continue
		}
		if err := enc.Encode(ev); err != nil {
			return n, fmt.Errorf("write event %d: %w", i, err)
		}
		if seen != nil {
			seen(&ev)
		}
		n++
	}
	if err := bw.Flush(); err != nil {
		return n, fmt.Errorf("write events: %w", err)
	}
	return n, nil
}

// CommandOptions are the flags of `appview-dev synth`.
type CommandOptions struct {
	Options
	// Out is the JSONL file to write ("-" or "" for stdout).
	Out string
	// ExpectedOut, when set, receives the expected state as JSON.
	ExpectedOut string
}

// Run is the `appview-dev synth --seed N --events N --out F.jsonl [--expected F.json]`
// entry point: it writes the stream and, when asked, the expected state.
func Run(ctx context.Context, o CommandOptions) error {
	var w io.Writer = os.Stdout
	if o.Out != "" && o.Out != "-" {
		f, err := os.Create(o.Out)
		if err != nil {
			return fmt.Errorf("synth: %w", err)
		}
		defer f.Close()
		w = f
	}
	exp, err := Write(ctx, w, o.Options)
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	if f, ok := w.(*os.File); ok && f != os.Stdout {
		if err := f.Close(); err != nil {
			return fmt.Errorf("synth: close %s: %w", o.Out, err)
		}
	}
	if o.ExpectedOut == "" {
		return nil
	}
	data, err := json.MarshalIndent(exp, "", " ")
	if err != nil {
		return fmt.Errorf("synth: encode expected state: %w", err)
	}
	if err := os.WriteFile(o.ExpectedOut, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	return nil
}

// ReadExpected loads an expected state written by Run.
func ReadExpected(path string) (*Expected, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var e Expected
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("read expected state %s: %w", path, err)
	}
	return &e, nil
}
