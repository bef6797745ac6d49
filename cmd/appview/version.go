package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/cli"
)

// Set at link time to override what the build info says, e.g.
//
//	go build -ldflags "-X main.version=v1.4.0 -X main.commit=$(git rev-parse HEAD)" ./cmd/appview
//
// (deploy/Dockerfile does this). Empty means: from debug.ReadBuildInfo.
var (
	version string
	commit  string
)

// buildIdentity is what `appview version` prints and appview_build_info carries.
type buildIdentity struct {
	Version   string
	Commit    string
	GoVersion string
}

// readBuildIdentity takes the module version and VCS revision recorded by
// the Go toolchain, overridden by the -ldflags variables. A
// build from a work tree has module version "(devel)"; a modified tree
// marks its revision with "-dirty".
func readBuildIdentity() buildIdentity {
	id := buildIdentity{Version: "(devel)", Commit: "unknown", GoVersion: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		if v := info.Main.Version; v != "" {
			id.Version = v
		}
		if info.GoVersion != "" {
			id.GoVersion = info.GoVersion
		}
		modified := false
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				id.Commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && id.Commit != "unknown" {
			id.Commit += "-dirty"
		}
	}
	if version != "" {
		id.Version = version
	}
	if commit != "" {
		id.Commit = commit
	}
	return id
}

func (b buildIdentity) String() string {
	return fmt.Sprintf("appview %s (commit %s, %s)", b.Version, b.Commit, b.GoVersion)
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print version, commit and Go version",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), readBuildIdentity())
			return err
		},
	}
}

// registerBuildInfo adds appview_build_info{version,commit,goversion} 1,
// the usual Prometheus idiom: a dashboard joins on it to show which build
// each instance runs.
func registerBuildInfo(reg prometheus.Registerer) error {
	id := readBuildIdentity()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "appview_build_info",
		Help:        "Always 1; the labels name the running build (version, VCS commit, Go version).",
		ConstLabels: prometheus.Labels{"version": id.Version, "commit": id.Commit, "goversion": id.GoVersion},
	})
	g.Set(1)
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("register appview_build_info: %w", err)
	}
	return nil
}
