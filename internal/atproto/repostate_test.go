package atproto

import "testing"

func TestInactiveReadsTheAccountStateRefusals(t *testing.T) {
	for _, c := range []struct {
		code, message string
		want          bool
	}{
		{"RepoDeactivated", "Repo has been deactivated: did:plc:a", true},
		{"RepoTakendown", "", true},
		{"RepoSuspended", "", true},
		{"RepoNotFound", "Could not find repo for DID: did:plc:a", true},
		{"InvalidRequest", "Could not find repo: did:plc:a", true},
		{"InvalidRequest", "Invalid cursor", false},
		{"RateLimitExceeded", "Could not find repo", false},
		{"", "", false},
	} {
		if got := RepoInactive(c.code, c.message); got != c.want {
			t.Errorf("Inactive(%q, %q) = %v, want %v", c.code, c.message, got, c.want)
		}
	}
}
