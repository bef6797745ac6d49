// This file reads a PDS's XRPC refusals that say a repository is
// not served because of its account's state.

package atproto

import "strings"

// RepoInactive reports whether an XRPC error (its `error` code and `message`)
// from a PDS says the repository is not served because its account is
// deactivated, taken down, suspended or gone: RepoDeactivated,
// RepoTakendown, RepoSuspended or RepoNotFound (com.atproto.sync,
// com.atproto.repo.describeRepo). The reference PDS names the state only
// there; its listRecords looks the account up among active ones and
// answers any other with InvalidRequest "Could not find repo: DID"
// (atproto, packages/pds/src/api/com/atproto/repo/listRecords.ts), which
// counts too. Either way the PDS serves none of the repository's records.
func RepoInactive(code, message string) bool {
	switch code {
	case "RepoDeactivated", "RepoTakendown", "RepoSuspended", "RepoNotFound":
		return true
	case "InvalidRequest":
		return strings.HasPrefix(message, "Could not find repo")
	}
	return false
}
