// Package logval bounds the values that reach a log line from input: a
// record, a frame, a URL, a peer's answer, or an error that quotes any of
// them (a database error can quote a whole statement). One such value
// once made a 122 KB log line. Every log call that writes a value taken
// from input passes it through String, Err or Error, which keep at
// most MaxBytes bytes (from both ends) and mark what they cut.
package logval

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxBytes is the most bytes of one value a log line keeps, marker
// excluded.
const MaxBytes = 512

// String returns s when it is at most MaxBytes long. Otherwise it keeps
// about MaxBytes/2 bytes from each end (cut at whole UTF-8 characters)
// around the marker "…[truncated N bytes]…", N being the bytes cut: the
// start says what the value is, and the end of an error is usually its
// cause (a database error quotes the statement first and the reason last).
// A value only a few bytes over (fewer than the marker would take) is kept
// whole: cutting it would make the line longer, not shorter.
func String(s string) string {
	if len(s) <= MaxBytes {
		return s
	}
	h, t := cuts(s)
	if m := marker(t - h); len(m) < t-h {
		return s[:h] + m + s[t:]
	}
	// Cutting fewer bytes than the marker takes would lengthen the line.
	return s
}

// cuts returns where the kept head of v ends and its kept tail starts, for
// len(v) > MaxBytes: MaxBytes/2 bytes each, moved by at most a character's
// length so as not to split one (invalid UTF-8 is cut where it falls).
func cuts(v string) (head, tail int) {
	const half = MaxBytes / 2
	head = half
	for head > half-utf8.UTFMax && !utf8.RuneStart(v[head]) {
		head--
	}
	if !utf8.RuneStart(v[head]) {
		head = half
	}
	tail = len(v) - half
	for tail < len(v)-half+utf8.UTFMax && tail < len(v) && !utf8.RuneStart(v[tail]) {
		tail++
	}
	if tail == len(v) || !utf8.RuneStart(v[tail]) {
		tail = len(v) - half
	}
	return head, tail
}

func marker(n int) string { return "…[truncated " + strconv.Itoa(n) + " bytes]…" }

// Err is String of err's message, "" for nil.
func Err(err error) string {
	if err == nil {
		return ""
	}
	return String(err.Error())
}

// Error returns err with its message bounded as String bounds it (nil for
// nil), for zerolog's Err: log.Warn().Err(logval.Error(err)). Unwrap gives
// err back, so errors.Is and errors.As still see through it.
func Error(err error) error {
	if err == nil {
		return nil
	}
	return bounded{err}
}

type bounded struct{ err error }

func (b bounded) Error() string { return String(b.err.Error()) }
func (b bounded) Unwrap() error { return b.err }

// MaskURL returns raw with the password of its user part shown as xxxxx,
// whether or not raw parses as a URL (url.URL.Redacted needs one that
// does), and whether or not it has a scheme. The user part ends at the
// last "@" before the path (or anywhere after, when the password itself
// holds a "/", "?" or "#"); it starts after the first "//" that only a
// scheme, or nothing, precedes ("http://u:pw@h", "//u:pw@h"), else after
// a scheme's ":" when a ":" still follows ("http:u:pw@h"), else at the
// start ("u:pw@h"); its password is what follows its first ":". Error
// messages quote the URLs an operator typed, and one that does not parse
// (a space in its password) or names no scheme must not be echoed with
// its secret. A user part without ":" is kept, as Redacted keeps it.
func MaskURL(raw string) string {
	start := 0
	if i := strings.Index(raw, "//"); i >= 0 && !strings.ContainsAny(raw[:i], "/?#@") {
		start = i + 2
	} else if i := strings.Index(raw, ":"); i >= 0 {
		if at := strings.LastIndex(raw, "@"); at > i && strings.Contains(raw[i+1:at], ":") {
			start = i + 1
		}
	}
	rest := raw[start:]
	end := len(rest)
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		end = i
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		at = strings.LastIndex(rest, "@")
	}
	if at < 0 {
		return raw
	}
	colon := strings.Index(rest[:at], ":")
	if colon < 0 {
		return raw
	}
	return raw[:start] + rest[:colon+1] + "xxxxx" + rest[at:]
}

// URLParseReason is err's reason without the URL it quotes: url.Parse's
// errors (*url.Error) repeat the whole URL, password included.
func URLParseReason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// RedactURL is MaskURL with every query value replaced by "xxxxx" too: a
// configured URL's query may carry a proxy's token (jetstream.urls keeps
// such parameters), and the URL is shown in logs and metric labels.
// Parameter names are kept, so the line still says which were given. A
// URL that does not parse is returned masked by MaskURL only.
func RedactURL(raw string) string {
	masked := MaskURL(raw)
	u, err := url.Parse(masked)
	if err != nil || u.RawQuery == "" {
		return masked
	}
	q := u.Query()
	for k, vs := range q {
		for i := range vs {
			vs[i] = "xxxxx"
		}
		q[k] = vs
	}
	u.RawQuery = q.Encode()
	return u.String()
}
