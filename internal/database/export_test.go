package database

// Exported for the external tests in sqld_test.go, which need the sqld
// server of package testsupport (itself an importer of this package).
var (
	OpenRemote            = openRemote
	OnConns               = onConns
	SqldStreamExpiry      = sqldStreamExpiry
	MigrateAtOnce         = migrateAtOnce
	AssertNULRefused      = assertNULRefused
	AssertTextRoundTrips  = assertTextRoundTrips
	AssertRefusalsRefused = assertRefusalsRefused
)
