package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/config"
)

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Configuration helpers"}
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
	cmd.AddCommand(initCmd)
	return cmd
}
