package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/webhooks"
)

// newWebhooksCommand is `appview webhooks add|list|rm`: managing webhook
// subscriptions (docs/spec.md §8 webhooks table, §9 deliveries). open returns a
// migrated database (for add and rm, which write); openRead one that is
// neither migrated nor created (for list, which only reads, and must work
// while an instance holds the write lock). Each subcommand opens the
// database once and closes it.
func newWebhooksCommand(open, openRead func(ctx context.Context) (*database.DB, error)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "webhooks",
		Short: "Manage webhook subscriptions",
		Long: "Manage webhook subscriptions. Each webhook receives a signed POST (docs/spec.md §9) for\n" +
			"every trigger it subscribes to about repositories of its DID.",
	}

	var (
		added              webhooks.Webhook
		triggers           = &blankSeen{} // --trigger's value, set below
		did, hookURL, secr onceFlag
		allowPrivate       bool
	)
	add := &cobra.Command{
		Use:   "add --did DID --url URL [--secret S] [--trigger push]",
		Short: "Add a webhook and print its id",
		Long: "Add a webhook and print its id. The URL must be http(s) and resolve to public\n" +
			"addresses unless --allow-private (deliveries are checked again, at connect time,\n" +
			"against webhooks.allow_private). --secret - reads the secret from the first line\n" +
			"of standard input, keeping it out of the shell history. A secret given must not\n" +
			"be empty or blank; omit --secret for an unsigned webhook. The URL must be at most\n" +
			fmt.Sprint(webhooks.MaxURLBytes) + " bytes and must not carry credentials (user:password@): the secret\n" +
			"authenticates deliveries. A webhook has one DID and one URL: --did, --url and\n" +
			"--secret are given once (add one webhook per DID or URL). A DID gets at most one\n" +
			"webhook per URL.",
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A stored webhook has one DID, one URL and one secret
			// (webhooks table): a repeated flag would silently keep its
			// last value, so it is refused.
			for _, f := range []struct {
				name, what string
				v          *onceFlag
				show       bool
			}{{"did", "belongs to one DID", &did, true}, {"url", "delivers to one URL", &hookURL, true}, {"secret", "has one secret", &secr, false}} {
				if len(f.v.values) < 2 {
					continue
				}
				given := fmt.Sprintf("%d times", len(f.v.values))
				if f.show { // never a secret: it would land in the terminal's scrollback and logs
					given = fmt.Sprintf("%d times (%q)", len(f.v.values), f.v.values)
				}
				return cli.Usage(cmd, "--%s given %s: a webhook %s; run webhooks add once for each", f.name, given, f.what)
			}
			if triggers.blank {
				// pflag reads --trigger "" as no triggers at all, which
				// would quietly drop it (or, alone, mean the default):
				// name it as the blank trigger it is, as in --trigger
				// push,,push.
				added.Triggers = append(added.Triggers, "")
			}
			w := added
			w.DID, w.URL, w.Secret = did.value(), hookURL.value(), secr.value()
			signed := cmd.Flags().Changed("secret")
			if w.Secret == "-" {
				line, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if err != nil && line == "" && !errors.Is(err, io.EOF) {
					return fmt.Errorf("read secret from stdin: %w", err)
				}
				w.Secret = strings.TrimRight(line, "\r\n")
				if strings.TrimSpace(w.Secret) == "" {
					// An operator who asked for a secret must not get an
					// unsigned webhook because stdin was empty.
					return cli.Usage(cmd, "--secret -: standard input gave an empty secret (omit --secret for an unsigned webhook)")
				}
			}
			if signed && strings.TrimSpace(w.Secret) == "" {
				// Empty is how the table stores "unsigned": an explicitly
				// empty secret (an unset variable in --secret "$S") must
				// not become an unsigned webhook.
				return cli.Usage(cmd, "--secret: the secret given is empty or only whitespace (omit --secret for an unsigned webhook)")
			}
			// Everything about the flags is checked before the database is
			// opened (and perhaps created): a refused flag is a usage error.
			guard := webhooks.Guard{AllowPrivate: allowPrivate, Key: "--allow-private"}
			w, err := webhooks.Check(cmd.Context(), w, guard)
			if errors.Is(err, webhooks.ErrInvalid) || errors.Is(err, webhooks.ErrRefused) {
				return cli.Usage(cmd, "%v", err)
			}
			if err != nil {
				return err
			}
			db, err := open(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			// The same URL twice for one DID (in any spelling of it:
			// SameURL) would deliver every event twice.
			existing, err := webhooks.List(cmd.Context(), db, w.DID)
			if err != nil {
				return err
			}
			for _, h := range existing {
				if webhooks.SameURL(h.URL, w.URL) {
					return fmt.Errorf("webhook %d already delivers to %s for %s (remove it first with `appview webhooks rm %d`)", h.ID, h.URL, h.DID, h.ID)
				}
			}
			id, err := webhooks.Add(cmd.Context(), db, w, guard)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), id)
			return err
		},
	}
	af := add.Flags()
	af.Var(&did, "did", "DID whose repositories trigger the webhook (required, once)")
	af.Var(&hookURL, "url", "http(s) URL receiving the POSTs (required, once)")
	af.Var(&secr, "secret", `HMAC-SHA256 signing secret, not empty ("-": read the first line of stdin; omitted: unsigned)`)
	af.StringSliceVar(&added.Triggers, "trigger", []string{webhooks.TriggerPush}, "trigger to subscribe to (repeatable)")
	triggers.Value = af.Lookup("trigger").Value
	af.Lookup("trigger").Value = triggers
	af.BoolVar(&allowPrivate, "allow-private", false, "accept a URL that resolves to a loopback/private address")
	_ = add.MarkFlagRequired("did")
	_ = add.MarkFlagRequired("url")

	var (
		listDID string
		asJSON  bool
	)
	list := &cobra.Command{
		Use:   "list [--did DID] [--json]",
		Short: "List webhooks (secrets are never printed)",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A malformed DID lists nothing; say so, as webhooks add does.
			if listDID != "" {
				if err := webhooks.CheckDID(listDID); err != nil {
					return cli.Usage(cmd, "%v", err)
				}
			}
			db, err := openRead(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			if err := cli.RequireTable(cmd.Context(), db, "webhooks"); err != nil {
				return err
			}
			hooks, err := webhooks.List(cmd.Context(), db, listDID)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				// Webhook never marshals its secret; say whether there is one.
				type listed struct {
					webhooks.Webhook
					Signed bool `json:"signed"`
				}
				rows := make([]listed, 0, len(hooks))
				for _, h := range hooks {
					rows = append(rows, listed{Webhook: h, Signed: h.Signed()})
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tDID\tURL\tTRIGGERS\tSIGNED\tCREATED")
			for _, h := range hooks {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%t\t%s\n", h.ID, h.DID, h.URL, strings.Join(h.Triggers, ","),
					h.Signed(), time.UnixMilli(h.CreatedAt).UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	cli.SingleVar(list.Flags(), &listDID, "did", "", "only webhooks of this DID (given once)",
		"one DID is listed; run webhooks list once for each, or omit --did for every webhook")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	rm := &cobra.Command{
		Use:   "rm ID",
		Short: "Remove a webhook and drop its pending deliveries",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return cli.Usage(cmd, "webhook id %q: want a positive integer, as `appview webhooks list` prints", args[0])
			}
			// The webhook to remove lives in a database that exists: a
			// mistyped database.url is refused ("no database at PATH",
			// exit 2) as by list, not created and migrated only to find
			// no webhook in it.
			probe, err := openRead(cmd.Context())
			if err != nil {
				return err
			}
			probe.Close()
			db, err := open(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			if err := webhooks.Remove(cmd.Context(), db, id); err != nil {
				if errors.Is(err, webhooks.ErrNotFound) {
					return fmt.Errorf("no webhook with id %d", id)
				}
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "removed webhook %d\n", id)
			return err
		},
	}

	cmd.AddCommand(add, list, rm)
	return cmd
}

// onceFlag is a string flag that keeps every value it is given, so that
// a command can refuse a repetition (pflag's string flag silently keeps
// the last one). It implements pflag.Value.
type onceFlag struct{ values []string }

func (f *onceFlag) Set(v string) error { f.values = append(f.values, v); return nil }
func (f *onceFlag) Type() string       { return "string" }

// String is the last value given ("" when none): what a plain string
// flag would hold.
func (f *onceFlag) String() string { return f.value() }

func (f *onceFlag) value() string {
	if len(f.values) == 0 {
		return ""
	}
	return f.values[len(f.values)-1]
}

// blankSeen wraps a list flag's value and remembers whether any of its
// values was blank: pflag reads --trigger "" (or --trigger=) as no
// element at all, so the list alone cannot tell it was given.
type blankSeen struct {
	pflag.Value
	blank bool
}

// Set records a blank s, then sets the wrapped value.
func (b *blankSeen) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		b.blank = true
	}
	return b.Value.Set(s)
}
