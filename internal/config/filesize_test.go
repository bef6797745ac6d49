package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A --config that never ends (/dev/zero) was read whole: serve grew until
// the kernel killed it. A file over MaxConfigFileBytes is refused naming
// --config, one at the bound is read.
func TestTheConfigFileIsReadUpToItsBound(t *testing.T) {
	dir := t.TempDir()
	atBound := filepath.Join(dir, "at.yaml")
	line := "log_level: info\n"
	pad := strings.Repeat("#", MaxConfigFileBytes-len(line)-1) + "\n"
	if err := os.WriteFile(atBound, []byte(line+pad), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(Sources{File: atBound}); err != nil {
		t.Fatalf("a file of exactly %d bytes was refused: %v", MaxConfigFileBytes, err)
	}
	over := filepath.Join(dir, "over.yaml")
	if err := os.WriteFile(over, []byte(line+pad+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{over, "/dev/zero"} {
		_, err := Load(Sources{File: path})
		var ce *Error
		if !errors.As(err, &ce) || ce.Key != "--config" || !strings.Contains(err.Error(), "is larger than 1048576 bytes") {
			t.Errorf("Load(%s) = %v, want a --config refusal naming the bound", path, err)
		}
	}
}
