package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/actors/backfill"
	"github.com/atcr-io/appview/actors/consumer"
	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/admin"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// Status page sampling: the lease table every
// statusLeaseEvery (to see handovers), the Jetstream lag every
// statusLagEvery (360 points an hour for the sparkline), but only while
// someone has viewed the page within statusWatchedFor. An instance whose
// page nobody watches makes no reads for it: in the partition test, a
// periodic read on an instance cut off from sqld delayed the other
// instance's takeover from about 1.6 s to about 5 s (sqld's stalled
// stream timeout), so the page must not add database traffic by itself.
const (
	statusLeaseEvery = 2 * time.Second
	statusLagEvery   = 10 * time.Second
	statusReadWithin = 2 * time.Second
	statusWatchedFor = 15 * time.Minute
)

var (
	contendersSQL = `SELECT ` + database.Text("instance") + `, MAX(seen_at) FROM lease_contenders GROUP BY instance`
	cursorSQL     = `SELECT time_us, fence FROM jetstream_cursor WHERE id = 1 AND time_us > 0`
	positionSQL   = `SELECT time_us, fence, ` + database.Text("host") + ` FROM jetstream_cursor WHERE id = 1 AND time_us > 0`
	outboxSQL     = `SELECT ` + database.Text("status") + `, COUNT(*) FROM webhook_deliveries GROUP BY status`
)

// sampleStatus feeds hist until ctx ends: one sample at once, then on the
// periods above. A failed read is skipped (the page shows the failure
// when it is rendered); it is logged at debug only.
func sampleStatus(ctx context.Context, db *sql.DB, hist *admin.History, log zerolog.Logger) {
	leases := time.NewTicker(statusLeaseEvery)
	defer leases.Stop()
	lastLag := time.Time{}
	for {
		if !hist.ViewedWithin(time.Now(), statusWatchedFor) {
			select {
			case <-ctx.Done():
				return
			case <-leases.C:
				continue
			}
		}
		rctx, cancel := context.WithTimeout(ctx, statusReadWithin)
		if rows, err := fence.ListBounded(rctx, db); err == nil {
			snaps := make([]admin.LeaseSnap, 0, len(rows))
			for _, r := range rows {
				snaps = append(snaps, admin.LeaseSnap{Name: r.Name, Holder: r.Holder, Fence: r.Fence, AcquiredAt: r.AcquiredAt, RenewedAt: r.RenewedAt})
			}
			hist.ObserveLeases(snaps)
		} else if ctx.Err() == nil {
			log.Debug().Err(err).Msg("status page: could not sample the leases")
		}
		if now := time.Now(); now.Sub(lastLag) >= statusLagEvery {
			var us, fence int64
			if err := db.QueryRowContext(rctx, cursorSQL).Scan(&us, &fence); err == nil {
				hist.ObserveLag(now, now.Sub(time.UnixMicro(us)))
				lastLag = now
			} else if err != sql.ErrNoRows && ctx.Err() == nil {
				log.Debug().Err(err).Msg("status page: could not sample the Jetstream cursor")
			}
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-leases.C:
		}
	}
}

// statusPage serves GET /: the fleet, leases, handovers, the consumer's
// health (local: this instance's LeaseActors' own views, nil for none),
// Jetstream position and lag, backfill progress and the webhook outbox,
// as one HTML page. A section whose read fails names the failure and the
// rest still shows.
func statusPage(db *database.DB, instance string, ttl time.Duration, hist *admin.History, local func() []lease.Status) http.Handler {
	version := readBuildIdentity().String()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), statusReadWithin)
		defer cancel()
		hist.Viewed(time.Now())
		p := admin.Page{Instance: instance, Version: version, Now: time.Now()}
		problem := func(what string, err error) {
			p.Problems = append(p.Problems, fmt.Sprintf("%s: %s", what, admin.OneLine(err.Error())))
		}
		holds := map[string][]string{}
		seen := map[string]time.Duration{}
		rows, err := fence.ListBounded(ctx, db)
		if err != nil {
			problem("leases", err)
		}
		snaps := make([]admin.LeaseSnap, 0, len(rows))
		for _, r := range rows {
			snaps = append(snaps, admin.LeaseSnap{Name: r.Name, Holder: r.Holder, Fence: r.Fence, AcquiredAt: r.AcquiredAt, RenewedAt: r.RenewedAt})
		}
		hist.ObserveLeases(snaps)
		p.Handovers = hist.Handovers()
		var dbNow int64
		for _, row := range rows {
			l := row.Listed()
			p.Leases = append(p.Leases, admin.Lease{Name: row.Name, Holder: row.Holder, State: l.State, Fence: row.Fence, TimeLeft: row.TimeLeft()})
			if l.State == fence.StateHeld {
				holds[row.Holder] = append(holds[row.Holder], row.Name)
				seen[row.Holder] = min(seenAgo(seen, row.Holder), time.Duration(row.Now-row.RenewedAt)*time.Millisecond)
			}
			dbNow = row.Now
		}
		if dbNow == 0 {
			dbNow = time.Now().UnixMilli()
		}
		if err := eachRow(ctx, db.DB, contendersSQL, func(rs *sql.Rows) error {
			var id string
			var at int64
			if err := rs.Scan(&id, &at); err != nil {
				return err
			}
			// A contender not seen for 3×TTL is gone (it is not nudged either).
			if ago := time.Duration(dbNow-at) * time.Millisecond; ago <= 3*ttl {
				seen[id] = min(seenAgo(seen, id), max(ago, 0))
			}
			return nil
		}); err != nil {
			problem("instances", err)
		}
		seen[instance] = 0
		for id, ago := range seen {
			sort.Strings(holds[id])
			p.Instances = append(p.Instances, admin.Instance{ID: id, SeenAgo: ago, Holds: holds[id], Self: id == instance})
		}
		sort.Slice(p.Instances, func(i, j int) bool { return p.Instances[i].ID < p.Instances[j].ID })

		p.Consumer = consumerHealth(local, rows)
		var us, fence int64
		var host string
		switch err := db.QueryRowContext(ctx, positionSQL).Scan(&us, &fence, &host); err {
		case nil:
			pos := time.UnixMicro(us).UTC()
			p.Jetstream = admin.Jetstream{Known: true, Position: pos, Host: host, Lag: time.Since(pos), Fence: fence}
		case sql.ErrNoRows:
		default:
			problem("jetstream position", err)
		}
		p.Jetstream.Points = hist.Points()

		if bp, err := backfill.ReadProgress(ctx, db); err != nil {
			problem("backfill", err)
		} else if bp.Run {
			var out bytes.Buffer
			writeETA(&out, bp)
			p.Backfill = admin.Backfill{Run: true, RunID: bp.RunID, Holder: bp.Holder, State: bp.State,
				Finished: bp.Finished(), Known: bp.ReposKnown, Failed: bp.ReposFailed, Records: bp.Records,
				Listing: !bp.ListingDone && bp.CompletedAt == nil, Fraction: bp.Fraction, ReposPerSecond: bp.ReposPerSecond, ETA: out.String(),
				FailedAttempts: bp.FailedAttempts, LastError: bp.LastError}
			if bp.LastErrorAt != nil {
				p.Backfill.LastErrorAgo = max(time.Since(*bp.LastErrorAt), 0)
			}
		}

		counts := map[string]int64{"pending": 0, "delivered": 0, "failed": 0}
		if err := eachRow(ctx, db.DB, outboxSQL, func(rs *sql.Rows) error {
			var state string
			var n int64
			if err := rs.Scan(&state, &n); err != nil {
				return err
			}
			counts[state] = n
			return nil
		}); err != nil {
			problem("webhook outbox", err)
		}
		for _, s := range []string{"pending", "delivered", "failed"} {
			p.Outbox = append(p.Outbox, admin.StateCount{State: s, Count: counts[s]})
		}

		var body bytes.Buffer
		if err := admin.RenderStatus(&body, p); err != nil {
			http.Error(w, "render status page: "+admin.OneLine(err.Error()), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		// No external assets: forbid any the page might be made to load.
		w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:")
		_, _ = w.Write(body.Bytes())
	})
}

// consumerHealth is the consumer's row: this instance's own report when
// its LeaseActor runs the consumer, else who holds the consumer's lease
// (rows: the lease table).
func consumerHealth(local func() []lease.Status, rows []fence.Row) admin.Consumer {
	var statuses []lease.Status
	if local != nil {
		statuses = local()
	}
	for _, st := range statuses {
		if st.Lease != consumer.LeaseName || !st.WorkerActive {
			continue
		}
		c := admin.Consumer{Here: true, Healthy: st.WorkerHealthy, Reason: st.HealthReason}
		if src := st.Source; src != nil {
			c.URL, c.Wire, c.State, c.LastError = src.URL, src.Wire, src.State, src.LastError
			if c.Events = !src.LastEvent.IsZero(); c.Events {
				c.LastEventAgo = max(time.Since(src.LastEvent), 0)
			}
		}
		return c
	}
	for _, r := range rows {
		if r.Name == consumer.LeaseName && r.Listed().State == fence.StateHeld {
			return admin.Consumer{Holder: r.Holder}
		}
	}
	return admin.Consumer{}
}

func seenAgo(seen map[string]time.Duration, id string) time.Duration {
	if d, ok := seen[id]; ok {
		return d
	}
	return time.Duration(1<<63 - 1)
}

// eachRow runs query and calls fn on every row.
func eachRow(ctx context.Context, db *sql.DB, query string, fn func(*sql.Rows) error) error {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
