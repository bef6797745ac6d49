package cleanup

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/config"
)

// ContenderStaleTTLs is how many lease TTLs a lease_contenders row may go
// unrefreshed before the sweep removes it. Contenders refresh seen_at every
// leases.retry_interval, so only instances that went away get this old; a
// live contender wrongly removed would simply write its row again.
const ContenderStaleTTLs = 20

// Rule is one prune rule: rows of Table matching Where are deleted once
// they are older than Age.
type Rule struct {
	// Name labels the rule in logs and metrics (the rule label of
	// appview_cleanup_rows_deleted_total).
	Name string
	// Table is the table pruned. It must be a rowid table (not WITHOUT
	// ROWID): chunks are selected by rowid.
	Table string
	// Where is an SQL predicate over Table selecting the rows to delete.
	// ?1 is bound to the cutoff: the database clock at the start of the
	// sweep minus Age, in Unix ms. It may refer to Table by name in
	// correlated subqueries.
	Where string
	// Age is how old (per the predicate's own timestamp column) a row must
	// be before it is deleted.
	Age time.Duration
}

// Rules returns the default prune rules for cfg (see the package comment).
func Rules(cfg config.Config) []Rule {
	keep := cfg.Cleanup.Retention
	return []Rule{
		{
			Name:  "webhook_deliveries",
			Table: "webhook_deliveries",
			Where: `status IN ('delivered', 'failed') AND updated_at < ?1`,
			Age:   keep,
		},
		{
			Name:  "backfill_runs",
			Table: "backfill_runs",
			Where: `completed_at IS NOT NULL AND completed_at < ?1
  AND id <> (SELECT latest.id FROM backfill_runs AS latest
             WHERE latest.completed_at IS NOT NULL
             ORDER BY latest.completed_at DESC, latest.id DESC LIMIT 1)`,
			Age: keep,
		},
		{
			Name:  "lease_contenders",
			Table: "lease_contenders",
			Where: `seen_at < ?1`,
			Age:   ContenderStaleTTLs * cfg.Leases.TTL,
		},
		{
			// A leases-off instance refreshes its record every renew
			// interval and deletes it at its stop: an old one is a
			// process that was killed (another one's refresh sweeps it
			// too, once overdue).
			Name:  "unleased_instances",
			Table: "unleased_instances",
			Where: `seen_at < ?1`,
			Age:   ContenderStaleTTLs * cfg.Leases.TTL,
		},
		{
			Name:  "billing_tier_pushes",
			Table: "billing_tier_pushes",
			Where: `updated_at < ?1 AND NOT EXISTS (
  SELECT 1 FROM hold_crew AS crew
  WHERE crew.hold_did = billing_tier_pushes.hold_did
    AND crew.member_did = billing_tier_pushes.user_did)`,
			Age: keep,
		},
	}
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// protectedTables are never pruned, whatever a rule says.
var protectedTables = map[string]bool{"leases": true, "schema_migrations": true}

func (r Rule) validate() error {
	switch {
	case r.Name == "":
		return fmt.Errorf("cleanup rule for table %q: empty name", r.Table)
	case !identifier.MatchString(r.Table):
		return fmt.Errorf("cleanup rule %q: table %q is not a plain identifier", r.Name, r.Table)
	case protectedTables[strings.ToLower(r.Table)]:
		return fmt.Errorf("cleanup rule %q: table %q is never pruned", r.Name, r.Table)
	case strings.TrimSpace(r.Where) == "":
		return fmt.Errorf("cleanup rule %q: empty predicate would delete every row", r.Name)
	case r.Age <= 0:
		return fmt.Errorf("cleanup rule %q: age must be positive, got %s", r.Name, r.Age)
	}
	return nil
}

// deleteSQL deletes at most ?2 rows matching the rule. SQLite's DELETE ...
// LIMIT needs a compile-time option, so the chunk is chosen by rowid.
func (r Rule) deleteSQL() string {
	return fmt.Sprintf("DELETE FROM %[1]s WHERE rowid IN (SELECT rowid FROM %[1]s WHERE (%[2]s) LIMIT ?2)",
		r.Table, r.Where)
}
