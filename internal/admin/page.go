package admin

import (
	"fmt"
	"html/template"
	"io"
	"strings"
	"time"
)

// Page is everything the status page shows, gathered by the caller.
type Page struct {
	// Instance is the instance_id serving the page; Version its build.
	Instance string
	Version  string
	// Now is when the page was gathered.
	Now time.Time
	// Instances are the fleet as the database knows it (lease holders and
	// contenders seen recently).
	Instances []Instance
	Leases    []Lease
	Handovers []Handover
	Consumer  Consumer
	Jetstream Jetstream
	Backfill  Backfill
	// Outbox counts webhook deliveries by state (pending, delivered, failed).
	Outbox []StateCount
	// Problems are reads that failed, one line each; the rest still shows.
	Problems []string
}

// Instance is one member of the fleet.
type Instance struct {
	ID string
	// SeenAgo is how long ago it last renewed a lease or contended.
	SeenAgo time.Duration
	// Holds names the leases it holds now.
	Holds []string
	// Self marks the instance serving the page.
	Self bool
}

// Lease is one leases row.
type Lease struct {
	Name, Holder, State string
	Fence               int64
	TimeLeft            time.Duration
}

// Consumer is the Jetstream consumer's own report of its health, from
// the instance that runs it; another instance's page names that one.
type Consumer struct {
	// Here: this instance runs the consumer, and the fields below are its
	// report. Otherwise Holder runs it ("": no instance holds its lease).
	Here   bool
	Holder string
	// Healthy is false while no event came from any host for
	// jetstream.unhealthy_after; Reason then says for how long.
	Healthy bool
	Reason  string
	// URL, Wire and State are the host it is on (or dialling, or waiting
	// to dial); LastError is why the last connection ended.
	URL, Wire, State, LastError string
	// Events: an event arrived under this grant, LastEventAgo ago.
	Events       bool
	LastEventAgo time.Duration
}

// Jetstream is the consumer's committed position.
type Jetstream struct {
	// Known is false before the first commit.
	Known    bool
	Position time.Time
	// Host is the host the position belongs to.
	Host  string
	Lag   time.Duration
	Fence int64
	// Points are the lag samples of the last hour (this instance's view).
	Points []Point
}

// Backfill is the latest run's progress.
type Backfill struct {
	Run    bool
	RunID  int64
	Holder string
	// State is backfill.Progress.State: running, completed, stopped (no
	// instance holds the backfill lease) or unknown (run with leases
	// disabled).
	State                            string
	Finished, Known, Failed, Records int64
	// Listing is true while relays are still listing (Known may grow).
	Listing        bool
	Fraction       float64
	ReposPerSecond float64
	ETA            string
	// FailedAttempts, LastError and LastErrorAgo are the run's failed
	// attempts (State "failing" while no attempt has begun since).
	FailedAttempts int64
	LastError      string
	LastErrorAgo   time.Duration
}

// StateCount is a number of rows in one state.
type StateCount struct {
	State string
	Count int64
}

var funcs = template.FuncMap{
	"dur":       human,
	"pct":       func(f float64) string { return fmt.Sprintf("%.1f%%", f*100) },
	"sparkline": func(p []Point) template.HTML { return Sparkline(p, 360, 48) },
	"utc":       func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"join":      strings.Join,
	"width":     func(f float64) string { return fmt.Sprintf("%.1f", f*100) },
}

var page = template.Must(template.New("status").Funcs(funcs).Parse(pageHTML))

// RenderStatus writes p as a complete HTML document.
func RenderStatus(w io.Writer, p Page) error { return page.Execute(w, p) }

// human renders d rounded for reading: 850ms, 12.3s, 4m10s, 2h3m.
func human(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return d.Round(time.Minute).String()
	}
}

// Sparkline draws the lag samples as an inline SVG polyline, w×h pixels,
// oldest at the left, the highest lag at the top. Fewer than two points
// draw a flat line with a note.
func Sparkline(points []Point, w, h int) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="spark" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="Jetstream lag, last hour">`, w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#f4f6f8"/>`, w, h)
	if len(points) < 2 {
		fmt.Fprintf(&b, `<line x1="0" y1="%d" x2="%d" y2="%d" stroke="#999" stroke-dasharray="4 3"/>`, h-2, w, h-2)
		fmt.Fprintf(&b, `<text x="6" y="%d" font-size="11" fill="#666">collecting samples…</text>`, h/2+4)
		b.WriteString(`</svg>`)
		return template.HTML(b.String())
	}
	first, last := points[0].At, points[len(points)-1].At
	span := last.Sub(first)
	var peak time.Duration
	for _, p := range points {
		peak = max(peak, p.Lag)
	}
	if peak <= 0 {
		peak = time.Second
	}
	b.WriteString(`<polyline fill="none" stroke="#2a6fdb" stroke-width="1.5" points="`)
	for i, p := range points {
		x := 0.0
		if span > 0 {
			x = float64(p.At.Sub(first)) / float64(span) * float64(w-2)
		}
		y := float64(h-3) - float64(max(p.Lag, 0))/float64(peak)*float64(h-6)
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", x+1, y)
	}
	b.WriteString(`"/>`)
	fmt.Fprintf(&b, `<text x="%d" y="11" font-size="10" fill="#666" text-anchor="end">max %s</text>`, w-4, template.HTMLEscapeString(human(peak)))
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

const pageHTML = `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>appview status: {{.Instance}}</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em;color:#1b1f24;max-width:70em}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.05em;margin:1.4em 0 .4em;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse}td,th{padding:.2em .8em .2em 0;text-align:left;vertical-align:top}th{font-weight:600;color:#57606a}
.muted{color:#57606a}.held,.healthy{color:#1a7f37;font-weight:600}.expired,.unhealthy{color:#cf222e;font-weight:600}.released{color:#9a6700}
.self{font-weight:600}.bar{width:20em;height:.8em;background:#eaeef2;display:inline-block;vertical-align:middle}
.bar>span{display:block;height:100%;background:#2a6fdb}.problem{color:#cf222e}code{font-size:.95em}
</style></head><body>
<h1>appview status</h1>
<div class="muted">served by <code id="self">{{.Instance}}</code> · {{.Version}} · {{utc .Now}}</div>
{{range .Problems}}<p class="problem">{{.}}</p>{{end}}

<h2>Instances</h2>
<table id="instances"><tr><th>instance</th><th>last seen</th><th>holds</th></tr>
{{range .Instances}}<tr class="instance{{if .Self}} self{{end}}"><td><code>{{.ID}}</code>{{if .Self}} (this page){{end}}</td><td>{{dur .SeenAgo}} ago</td><td>{{if .Holds}}{{join .Holds ", "}}{{else}}<span class="muted">nothing</span>{{end}}</td></tr>
{{else}}<tr><td colspan="3" class="muted">no instance has contended yet</td></tr>{{end}}
</table>

<h2>Leases</h2>
<table id="leases"><tr><th>lease</th><th>holder</th><th>fence</th><th>state</th><th>time left</th></tr>
{{range .Leases}}<tr><td>{{.Name}}</td><td class="holder"><code>{{.Holder}}</code></td><td>{{.Fence}}</td><td class="{{.State}}">{{.State}}</td><td>{{if eq .State "held"}}{{dur .TimeLeft}}{{else}}–{{end}}</td></tr>
{{else}}<tr><td colspan="5" class="muted">no lease granted yet</td></tr>{{end}}
</table>
<h3 class="muted" style="font-size:.95em">Last handovers (seen by this instance)</h3>
<table id="handovers"><tr><th>when</th><th>lease</th><th>from</th><th>to</th><th>fence</th><th>gap</th></tr>
{{range .Handovers}}<tr><td>{{utc .At}}</td><td>{{.Lease}}</td><td><code>{{.From}}</code></td><td><code>{{.To}}</code></td><td>{{.FromFence}} → {{.ToFence}}</td><td>{{dur .Gap}}</td></tr>
{{else}}<tr><td colspan="6" class="muted">none since this instance started</td></tr>{{end}}
</table>

<h2>Jetstream</h2>
{{with .Consumer}}{{if .Here}}<p id="consumer">consumer <span class="{{if .Healthy}}healthy{{else}}unhealthy{{end}}">{{if .Healthy}}healthy{{else}}unhealthy{{end}}</span>{{if not .Healthy}}: <span id="consumer-reason">{{.Reason}}</span>{{end}}
{{if .URL}}· on <code id="consumer-url">{{.URL}}</code> ({{.Wire}} wire, {{.State}}){{end}} · last event {{if .Events}}{{dur .LastEventAgo}} ago{{else}}none yet{{end}}{{if and (not .Healthy) .LastError}}
<br><span class="muted">last error: {{.LastError}}</span>{{end}}</p>
{{else if .Holder}}<p id="consumer" class="muted">consumer run by <code>{{.Holder}}</code>: its own status page shows its health</p>
{{else}}<p id="consumer" class="unhealthy">no instance runs the consumer: its lease is not held</p>{{end}}{{end}}
{{with .Jetstream}}{{if .Known}}<p id="jetstream">position <code>{{utc .Position}}</code>{{if .Host}} from <code>{{.Host}}</code>{{end}} · lag <b>{{dur .Lag}}</b> · fence {{.Fence}}</p>{{else}}<p id="jetstream" class="muted">no position committed yet</p>{{end}}
<div>{{sparkline .Points}} <span class="muted">lag, last hour</span></div>{{end}}

<h2>Backfill</h2>
{{with .Backfill}}{{if .Run}}<p id="backfill">run {{.RunID}} ({{.State}}, <code>{{.Holder}}</code>)
<span class="bar"><span style="width:{{width .Fraction}}%"></span></span> {{pct .Fraction}} ·
{{.Finished}}/{{.Known}}{{if .Listing}}+{{end}} repos ({{.Failed}} failed) · {{.Records}} records · {{printf "%.2f" .ReposPerSecond}} repos/s · ETA {{.ETA}}{{if and .LastError (ne .State "completed")}}
<br><span id="backfill-error" class="{{if eq .State "failing"}}problem{{else}}muted{{end}}">{{.FailedAttempts}} failed attempt{{if ne .FailedAttempts 1}}s{{end}}, the last {{dur .LastErrorAgo}} ago: {{.LastError}}</span>{{end}}</p>
{{else}}<p id="backfill" class="muted">no backfill run recorded</p>{{end}}{{end}}

<h2>Webhook outbox</h2>
<table id="outbox"><tr><th>state</th><th>deliveries</th></tr>
{{range .Outbox}}<tr><td>{{.State}}</td><td>{{.Count}}</td></tr>{{end}}
</table>
</body></html>
`
