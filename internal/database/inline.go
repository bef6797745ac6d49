package database

import (
	"database/sql/driver"
	"encoding/hex"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// inline returns query with each parameter (?NNN or ?) replaced by its
// argument written as an SQL literal, and true; false when it cannot
// spell the statement exactly (named parameters, an argument missing or
// unused, a float, text that is not UTF-8 or holds a NUL, the one
// integer a literal cannot write), which is then bound as usual.
//
// Why: go-libsql prepares a statement that has arguments by asking a
// libSQL server to describe it first, a request on a stream of its own,
// so every such write cost two requests where one without arguments costs
// one; sqld spends about as much CPU on the describe as on the write
// (docs/performance.md). A query (rows back) is described either way.
//
// Parameters are found by SQLite's own lexical rules: none inside a
// string literal, a quoted identifier ("x", `x`, [x]) or a comment, and
// ? numbers itself one above the largest number so far.
func inline(query string, args []driver.NamedValue) (string, bool) {
	byOrdinal := make([]driver.Value, len(args)+1)
	for _, a := range args {
		if a.Name != "" || a.Ordinal < 1 || a.Ordinal > len(args) {
			return "", false
		}
		byOrdinal[a.Ordinal] = a.Value
	}
	used := make([]bool, len(args)+1)
	var b strings.Builder
	b.Grow(len(query) + 16*len(args))
	last, high := 0, 0
	for i := 0; i < len(query); {
		switch c := query[i]; {
		case c == '\'' || c == '"' || c == '`':
			i = skipQuoted(query, i, c)
		case c == '[':
			i = skipTo(query, i+1, "]")
		case c == '-' && strings.HasPrefix(query[i:], "--"):
			i = skipTo(query, i+2, "\n")
		case c == '/' && strings.HasPrefix(query[i:], "/*"):
			i = skipTo(query, i+2, "*/")
		case c == ':' || c == '@' || c == '$':
			return "", false
		case c == '?':
			j := i + 1
			for j < len(query) && query[j] >= '0' && query[j] <= '9' {
				j++
			}
			n := high + 1
			if j > i+1 {
				var err error
				if n, err = strconv.Atoi(query[i+1 : j]); err != nil {
					return "", false
				}
			}
			if n < 1 || n > len(args) {
				return "", false
			}
			lit, ok := literal(byOrdinal[n])
			if !ok {
				return "", false
			}
			high, used[n] = max(high, n), true
			b.WriteString(query[last:i])
			b.WriteString(lit)
			last, i = j, j
		default:
			i++
		}
	}
	for n := 1; n <= len(args); n++ {
		if !used[n] {
			return "", false // bound as given, the driver says what is wrong
		}
	}
	b.WriteString(query[last:])
	return b.String(), true
}

// skipQuoted returns the index after the literal or identifier quoted by
// q that opens at i (a doubled q stands for itself).
func skipQuoted(s string, i int, q byte) int {
	for j := i + 1; j < len(s); j++ {
		if s[j] == q {
			if j+1 < len(s) && s[j+1] == q {
				j++
				continue
			}
			return j + 1
		}
	}
	return len(s)
}

// skipTo returns the index after the first end at or after i.
func skipTo(s string, i int, end string) int {
	if k := strings.Index(s[i:], end); k >= 0 {
		return i + k + len(end)
	}
	return len(s)
}

// literal writes v as go-libsql would bind it: integers and booleans as
// INTEGER, strings and times (RFC 3339) as TEXT, []byte as a BLOB, nil as
// NULL. A negative integer is parenthesized (x-?1 must not become the
// comment x--1).
func literal(v driver.Value) (string, bool) {
	switch v := v.(type) {
	case nil:
		return "NULL", true
	case int64:
		switch {
		case v == math.MinInt64: // 9223372036854775808 would read as a REAL
			return "", false
		case v < 0:
			return "(" + strconv.FormatInt(v, 10) + ")", true
		}
		return strconv.FormatInt(v, 10), true
	case bool:
		if v {
			return "1", true
		}
		return "0", true
	case string:
		return text(v)
	case time.Time:
		return text(v.Format(time.RFC3339Nano))
	case []byte:
		return "X'" + hex.EncodeToString(v) + "'", true
	}
	return "", false
}

func text(s string) (string, bool) {
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return "", false
	}
	return "'" + strings.ReplaceAll(s, "'", "''") + "'", true
}
