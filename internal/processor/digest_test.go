package processor

import (
	"regexp"
	"testing"
)

// digestGrammar is the OCI image specification's digest grammar as a
// regular expression, the oracle isDigest is held to.
var digestGrammar = regexp.MustCompile(`^[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$`)

var digestSeeds = []string{
	"sha256:6c3c624b58dbbcd3c0dd82b4c53f04194d1247c6eebdaab7c610cf7d66709b3b",
	"sha512:abc", "multihash+base58:QmRZxt2b1FVZPNqd8hsiykDL3TdBDeTSPX9Kv46HmX4Gx8",
	"sha256+b64u:LCa0a2j_xo_5m0U8HTBBNBNCLXBkg7-g-YpeiGJm564", "a.b_c-d:x=", "a:b",
	"", ":", "sha256:", ":abc", "SHA256:abc", "sha256::abc", "sha256:ab:c", "sha256:a b",
	"+sha:abc", "sha+:abc", "sha++256:abc", "sha.-256:abc", "sha256:abc\n", "sha256:abé",
	"sha256:a/b", "sha256:a.b", "sh a:b", "ünï:abc", "sha256:abc\x00",
}

func TestIsDigestFollowsTheOCIGrammar(t *testing.T) {
	for _, v := range digestSeeds {
		if got, want := isDigest(v), digestGrammar.MatchString(v); got != want {
			t.Errorf("isDigest(%q) = %v, the grammar says %v", v, got, want)
		}
	}
}

func FuzzIsDigestFollowsTheOCIGrammar(f *testing.F) {
	for _, v := range digestSeeds {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if got, want := isDigest(v), digestGrammar.MatchString(v); got != want {
			t.Fatalf("isDigest(%q) = %v, the grammar says %v", v, got, want)
		}
	})
}
