// Command appview-dev holds the developer tools that are not the product:
// `bench` measures the lease runtime and the consumer on real `appview
// serve` processes, `synth` writes synthetic io.atcr.* Jetstream traffic
// and the database state it must produce, `synth-check` compares a
// database with that state. They link test support (internal/harness), which
// the shipped `appview` binary must not (cmd/appview/deps_test.go).
package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/config"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	root := newRootCommand()
	root.SetArgs(args)
	return cli.Exit("appview-dev", root.Execute())
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "appview-dev",
		Short:         "Developer tools of the appview worker runtime: bench, synth, synth-check",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	flags := &cli.ConfigFlags{}
	flags.Register(root)
	load := func() (config.Config, error) {
		cfg, err := flags.Load()
		flags.PrintWarnings()
		return cfg, err
	}
	root.AddCommand(newSynthCommand(), newSynthCheckCommand(load), newBenchCommand())
	cli.StrictUsage(root)
	return root
}
