package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/admin"
	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/config"
)

func newConfigCommand(flags *cli.ConfigFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Configuration helpers: init, check, show"}
	sample := config.SampleFor(workerKeys())
	var force bool
	initCmd := &cobra.Command{
		Use:   "init [FILE]",
		Short: "Write a commented default configuration (to stdout without FILE or with -)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 || args[0] == "-" {
				_, err := fmt.Fprint(cmd.OutOrStdout(), sample)
				return err
			}
			if strings.TrimSpace(args[0]) == "" {
				return cli.Usage(cmd, "FILE is empty (omit it, or give -, to write to stdout)")
			}
			// O_NONBLOCK: opening a FIFO for writing would otherwise wait
			// for a reader forever; it and any other file that is not a
			// regular one are refused below.
			flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL | syscall.O_NONBLOCK
			if force {
				flags = os.O_WRONLY | os.O_CREATE | syscall.O_NONBLOCK
			}
			f, err := os.OpenFile(args[0], flags, 0o644)
			if errors.Is(err, fs.ErrExist) {
				// Refused before anything was written: exit 2, as a usage
				// error. --force is suggested only where it would help.
				if st, serr := os.Stat(args[0]); serr == nil && !st.Mode().IsRegular() {
					return cli.Usage(cmd, "%s is not a regular file", args[0])
				}
				return cli.Usage(cmd, "%s exists (use --force to overwrite)", args[0])
			}
			if errors.Is(err, syscall.ENXIO) || errors.Is(err, syscall.EISDIR) { // a FIFO with no reader, a directory
				return cli.Usage(cmd, "%s is not a regular file", args[0])
			}
			if err != nil {
				return fmt.Errorf("write config: %w", err)
			}
			if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
				f.Close()
				if err != nil {
					return fmt.Errorf("write config: %w", err)
				}
				return cli.Usage(cmd, "%s is not a regular file", args[0])
			}
			if err := f.Truncate(0); err != nil { // --force: only now that it is a regular file
				f.Close()
				return fmt.Errorf("write config: %w", err)
			}
			if _, err := f.WriteString(sample); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		},
	}
	initCmd.Flags().BoolVar(&force, "force", false, "overwrite FILE if it exists")
	cmd.AddCommand(initCmd, newConfigCheckCommand(flags), newConfigShowCommand(flags))
	return cmd
}

// newConfigCheckCommand builds `config check [FILE]`: the validation serve
// runs on its configuration (the file, the environment, --set), without
// opening the database or any port.
func newConfigCheckCommand(flags *cli.ConfigFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "check [FILE]",
		Short: "Check the configuration serve would start with (FILE or --config, APPVIEW_*, --set): every problem, exit 2; or one line, exit 0",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := checkConfig(cmd, flags, args); err != nil {
				return err
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), checkSummary(flags))
			return err
		},
	}
}

// newConfigShowCommand builds `config show [FILE]`: the configuration
// serve would start with, as YAML, each value's source, no secret.
func newConfigShowCommand(flags *cli.ConfigFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "show [FILE]",
		Short: "Print the configuration in effect as YAML, each value with its source (default, FILE:LINE, APPVIEW_*, --set); secrets masked",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := checkConfig(cmd, flags, args)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), config.Show(cfg, flags.Origins(), flags.File()))
			return err
		},
	}
}

// checkConfig loads the configuration as serve does, from FILE (args) or
// --config, the environment and --set (config.Check, the code of serve's
// refusals), and prints the warnings about APPVIEW_* variables, then
// every problem as serve would refuse the first: one stderr line each. Its
// error, with problems, exits 2.
func checkConfig(cmd *cobra.Command, flags *cli.ConfigFlags, args []string) (config.Config, error) {
	if len(args) == 1 {
		if strings.TrimSpace(args[0]) == "" {
			return config.Config{}, cli.Usage(cmd, "FILE is empty (omit it to check --config, or the defaults)")
		}
		if err := flags.UseFile(args[0]); err != nil {
			return config.Config{}, cli.Usage(cmd, "%v", err)
		}
	}
	cfg, problems := flags.Check()
	flags.PrintWarnings()
	if len(problems) == 0 {
		return cfg, nil
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, "appview:", admin.OneLine(p.Error()))
	}
	what := "1 problem"
	if len(problems) > 1 {
		what = fmt.Sprintf("%d problems", len(problems))
	}
	return cfg, &cli.StartError{Err: fmt.Errorf("%s: serve would refuse to start (exit 2)", what)}
}

// checkSummary is config check's line for a valid configuration: how
// many keys each source set.
func checkSummary(flags *cli.ConfigFlags) string {
	var file, env, set int
	for _, o := range flags.Origins() {
		switch {
		case strings.HasPrefix(o, "line "):
			file++
		case o == "from --set":
			set++
		default:
			env++
		}
	}
	from := "no --config file"
	if flags.File() != "" {
		from = fmt.Sprintf("%d from %s", file, flags.File())
	}
	return fmt.Sprintf("configuration valid: keys set: %s, %d from APPVIEW_* variables, %d from --set; every other key at its default", from, env, set)
}
