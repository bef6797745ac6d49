// This file runs the AT Protocol services the feed workers talk to
// as in-process HTTP servers on loopback, for tests: a labeler
// (com.atproto.label.subscribeLabels over websocket), a relay
// (com.atproto.sync.listReposByCollection), PDSes
// (com.atproto.repo.listRecords), a PLC directory, and ATCR holds
// (GET /xrpc/_health, io.atcr.hold.updateCrewTier). Each fake records
// what it was asked (cursors, request counts) and lets a test script
// failures, pauses and pagination, so a test can assert on the protocol as
// the peer saw it.
//
// It is test support: nothing in the appview binary imports it.

package testsupport
