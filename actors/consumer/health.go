package consumer

import (
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/workers"
)

// healthTick is how often the consumer re-evaluates its health report.
const healthTick = time.Second

// reportHealth keeps Options.Health current until bg closes: unhealthy
// while no event arrived from any upstream for jetstream.unhealthy_after,
// with the host it is on (Health.Source). Silence counts from this
// incarnation's start, or, when the process's consumer was already
// unhealthy (a new grant, a restart), from when it went silent: a new
// incarnation is not healthy before an event arrives. Each change is
// logged once: warn when it becomes unhealthy, info when events arrive
// again; the re-evaluations in between log nothing.
func (c *consumer) reportHealth(client *jetstream.Client) {
	h := c.o.Health
	if h == nil {
		return
	}
	bound := c.o.Jetstream.UnhealthyAfter
	from := time.Now()
	if ok, since, _ := h.Status(); !ok {
		from = since.Add(-bound)
	}
	t := time.NewTicker(min(healthTick, max(bound/4, time.Millisecond)))
	defer t.Stop()
	for {
		c.checkHealth(client.Upstream(), from, bound)
		select {
		case <-c.bg:
			return
		case <-t.C:
		}
	}
}

// checkHealth sets Options.Health from where the client stands (up) and
// logs a change; silence counts from from before the first event.
func (c *consumer) checkHealth(up jetstream.Upstream, from time.Time, bound time.Duration) {
	h := c.o.Health
	h.SetSource(workers.Source{URL: up.URL, Wire: string(up.Wire), State: up.State, LastError: up.LastError, LastEvent: up.LastEvent})
	last := up.LastEvent
	if last.IsZero() {
		last = from
	}
	silent := time.Since(last)
	if bound <= 0 || silent <= bound {
		if _, since, _ := h.Status(); h.Set(true, "") {
			c.log.Info().Str("url", up.URL).Str("wire", string(up.Wire)).Dur("unhealthy_for", time.Since(since)).
				Msg("Jetstream consumer healthy again: events arrive")
		}
		return
	}
	reason := fmt.Sprintf("no event from any host for %v", silent.Truncate(time.Second))
	if h.Set(false, reason) {
		ev := c.log.Warn().Str("reason", reason).Str("url", up.URL).Str("wire", string(up.Wire)).Str("state", up.State)
		if up.LastError != "" {
			ev = ev.Str("last_error", up.LastError)
		}
		ev.Msg("Jetstream consumer unhealthy: every host unreachable or silent (says so again only when events arrive)")
	}
}
