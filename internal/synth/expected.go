package synth

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"

	"github.com/atcr-io/appview/internal/database"
)

// Expected is the exact database state a synthetic stream must produce, as
// canonical row strings: Tables[table][key] = row. Columns compared are
// those listed in Tables below (every docs/spec.md §8 key column the stream
// touches, plus the processor's own columns that are a function of the
// events). repository_stats.fence is not compared: it names the writer.
type Expected struct {
	// Tables maps a table name to its rows by key.
	Tables map[string]map[string]string `json:"tables"`
	// PushEventKeys are the webhook "push" event keys, one per manifest
	// newly stored (push:<did>/<repository>@<digest>), sorted.
	PushEventKeys []string `json:"push_event_keys"`
	// Events is how many events the stream has; MaxTimeUS is the last time_us.
	Events    int   `json:"events"`
	MaxTimeUS int64 `json:"max_time_us"`
	// LastUS is the time_us of the last event a server filtering on
	// io.atcr.* sends (every event but other collections' commits): once
	// a consumer's stored position reaches it, the stream is consumed.
	LastUS int64 `json:"last_us,omitempty"`
}

// table says how Diff reads one table: keyCols leading columns form the
// key, the rest the row.
type table struct {
	name    string
	query   string
	keyCols int
}

// Tables are the tables Expected covers and the columns compared. Every
// TEXT column is read through database.Text (text, below), so the
// comparison sees the stored bytes, not go-libsql's date rewrite of them.
var tables = []table{
	{"users", `SELECT ` + text("did", "handle") + `, active, ` + text("status", "default_hold") + `, auto_remove_untagged,
  profile_created_at, profile_updated_at, updated_at FROM users`, 1},
	{"manifests", `SELECT ` + text("did", "repository", "digest", "rkey", "hold_did", "hold_endpoint", "media_type") + `,
  schema_version, ` + text("config_digest", "subject_digest") + `, created_at, indexed_at,
  (SELECT COUNT(*) FROM manifest_layers l WHERE l.manifest_id = m.id),
  (SELECT COUNT(*) FROM manifest_references r WHERE r.manifest_id = m.id),
  ` + text(`(SELECT COALESCE(group_concat(key || '=' || value, ','), '') FROM
     (SELECT key, value FROM manifest_annotations a WHERE a.manifest_id = m.id ORDER BY key))`) + `
  FROM manifests m`, 3},
	{"tags", `SELECT ` + text("did", "repository", "tag", "digest", "rkey") + `, created_at, updated_at FROM tags`, 3},
	{"stars", `SELECT ` + text("did", "rkey", "owner_did", "repository") + `, created_at FROM stars`, 2},
	{"repo_pages", `SELECT ` + text("did", "repository", "rkey", "description", "avatar_cid") + `, created_at, updated_at
  FROM repo_pages`, 2},
	{"hold_captains", `SELECT ` + text("hold_did", "owner_did") + `, public, allow_all_crew, enable_bluesky_posts, deployed_at,
  ` + text("region", "provider", "successor") + ` FROM hold_captains`, 1},
	{"hold_crew", `SELECT ` + text("hold_did", "rkey", "member_did", "role", "permissions", "tier") + `, added_at
  FROM hold_crew`, 2},
	{"repository_hold_stats", `SELECT ` + text("did", "repository", "hold_did") + `, pull_count, push_count, last_pull,
  last_push, updated_at FROM repository_hold_stats`, 3},
	{"repository_stats", `SELECT ` + text("did", "repository") + `, pull_count, push_count, last_pull, last_push, star_count,
  updated_at FROM repository_stats`, 2},
}

// text is the select list reading each TEXT expression through
// database.Text, comma-separated.
func text(exprs ...string) string {
	out := make([]string, len(exprs))
	for i, e := range exprs {
		out[i] = database.Text(e)
	}
	return strings.Join(out, ", ")
}

// cell renders one value the same way for the model and the database.
func cell(v any) string {
	switch x := v.(type) {
	case nil:
		return "NULL"
	case bool:
		if x {
			return "1"
		}
		return "0"
	case *int64:
		if x == nil {
			return "NULL"
		}
		return fmt.Sprint(*x)
	case []byte:
		return string(x)
	default:
		return fmt.Sprint(x)
	}
}

func join(vals []any) string {
	parts := make([]string, len(vals))
	for i, v := range vals {
		parts[i] = cell(v)
	}
	return strings.Join(parts, "|")
}

// put stores one row of the model.
func (e *Expected) put(tableName string, keyCols int, vals ...any) {
	if e.Tables[tableName] == nil {
		e.Tables[tableName] = map[string]string{}
	}
	e.Tables[tableName][join(vals[:keyCols])] = join(vals[keyCols:])
}

// maxDiffLines bounds the report per table.
const maxDiffLines = 20

// Diff compares the database with expected and returns one line per
// difference (empty: equal). A query failure is reported as a line too.
// It does not compare webhook deliveries: those belong to the webhooks
// package; compare PushEventKeys with what was enqueued.
func Diff(ctx context.Context, db *sql.DB, exp *Expected) []string {
	var out []string
	for _, t := range tables {
		have, err := readTable(ctx, db, t)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", t.name, err))
			continue
		}
		want := exp.Tables[t.name]
		var lines []string
		for k, w := range want {
			h, ok := have[k]
			switch {
			case !ok:
				lines = append(lines, fmt.Sprintf("%s: missing row %s => %s", t.name, k, w))
			case h != w:
				lines = append(lines, fmt.Sprintf("%s: row %s: have %s, want %s", t.name, k, h, w))
			}
		}
		for k, h := range have {
			if _, ok := want[k]; !ok {
				lines = append(lines, fmt.Sprintf("%s: unexpected row %s => %s", t.name, k, h))
			}
		}
		sort.Strings(lines)
		if len(lines) > maxDiffLines {
			lines = append(lines[:maxDiffLines], fmt.Sprintf("%s: ... %d more differences", t.name, len(lines)-maxDiffLines))
		}
		out = append(out, lines...)
	}
	return out
}

func readTable(ctx context.Context, db *sql.DB, t table) (map[string]string, error) {
	rows, err := db.QueryContext(ctx, t.query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		out[join(vals[:t.keyCols])] = join(vals[t.keyCols:])
	}
	return out, rows.Err()
}
