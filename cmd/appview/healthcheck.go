package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/admin"
	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/outbound"
)

// healthcheckTimeout bounds the probe (a container HEALTHCHECK has its
// own, longer timeout).
const healthcheckTimeout = 3 * time.Second

// newHealthcheckCommand is `appview healthcheck`: GET /readyz of the
// instance the configuration describes, or of the admin endpoint --url
// names (readyzURL), and exit 0 when it answers 200,
// 1 otherwise, with one line. It exists for container images without
// curl or a shell (deploy/Dockerfile HEALTHCHECK).
func newHealthcheckCommand(flags *cli.ConfigFlags) *cobra.Command {
	var url string
	cmd := &cobra.Command{
		Use:   "healthcheck [--url URL]",
		Short: "Probe this instance's /readyz; exit 0 when ready (for container health checks)",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if url != "" {
				// The rules of every URL key (outbound.Check).
				u, err := outbound.CheckURL(url, "http", "https")
				if err != nil {
					return cli.Usage(cmd, "--url: %s", err)
				}
				url = readyzURL(u)
			}
			if url == "" {
				cfg, err := flags.Load()
				if err != nil {
					return err
				}
				if cfg.Admin.Addr == "" {
					return flags.Explain(cli.Refuse("admin.addr", "empty: the admin endpoint is disabled, there is nothing to probe"))
				}
				if _, port, err := net.SplitHostPort(cfg.Admin.Addr); err == nil && port == "0" {
					return flags.Explain(cli.Refuse("admin.addr", "%s: port 0 is chosen by the instance when it starts, so there is no port to probe; pass --url with the address its \"appview started\" line names", cfg.Admin.Addr))
				}
				url = "http://" + probeAddr(cfg.Admin.Addr) + "/readyz"
			}
			client := &http.Client{Timeout: healthcheckTimeout}
			resp, err := client.Get(url)
			if err != nil {
				return err // "Get "URL": ...", a password in it shown as ***
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			line := admin.OneLine(string(body))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: HTTP %d: %s", resp.Request.URL.Redacted(), resp.StatusCode, line)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", url, line)
			return err
		},
	}
	cli.SingleVar(cmd.Flags(), &url, "url", "", "admin endpoint URL, given once; /readyz is appended to its path unless it ends in /readyz (default: admin.addr, an unspecified host probed on loopback)",
		"one instance is probed per run; run healthcheck once for each")
	return cmd
}

// readyzURL is the readiness URL of the admin endpoint u names: u with
// /readyz appended to its path (a trailing slash trimmed) unless the path
// already ends in /readyz. The query stays where it is, after the path.
// So "http://127.0.0.1:5001" and ".../" probe /readyz, not the status
// page "/", which answers 200 while the instance is not ready.
func readyzURL(u *url.URL) string {
	p := strings.TrimSuffix(u.EscapedPath(), "/")
	if !strings.HasSuffix(p, "/readyz") {
		p += "/readyz"
	}
	if unescaped, err := url.PathUnescape(p); err == nil {
		u.Path, u.RawPath = unescaped, p
	}
	return u.String()
}

// probeAddr turns a listen address into one to connect to: an empty or
// unspecified host (":5001", "0.0.0.0:5001", "[::]:5001") is reached on
// loopback.
func probeAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), port)
}
