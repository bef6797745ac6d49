package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// UsageError is a command line that cannot be run as typed: an unknown
// command or flag, a bad flag value, a wrong number of arguments or a
// missing required flag. Like a refused configuration it exits 2 with one
// stderr line; the line points at the command's --help.
type UsageError struct {
	err error
	// path is the command path, e.g. "appview webhooks rm".
	path string
}

func (e *UsageError) Error() string {
	return fmt.Sprintf("%v (see %s --help)", e.err, e.path)
}

func (e *UsageError) Unwrap() error { return e.err }

// Usage returns a *UsageError for cmd with the formatted reason.
func Usage(cmd *cobra.Command, format string, args ...any) error {
	return &UsageError{err: fmt.Errorf(format, args...), path: cmd.CommandPath()}
}

// StrictUsage makes every usage error under root a *UsageError. Cobra
// returns plain errors for them (so they exited 1, like a runtime
// failure), and for a command group given an unknown subcommand it prints
// the help and succeeds (so does `help` for a topic that does not exist).
// Call it once the command tree is complete.
func StrictUsage(root *cobra.Command) {
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		// pflag wraps a value's refusal in "invalid argument ... for
		// ... flag": a repeated flag says it all itself.
		var rep *RepeatedFlagError
		if errors.As(err, &rep) {
			err = rep
		}
		return &UsageError{err: err, path: cmd.CommandPath()}
	})
	// The default help and completion commands are added while executing;
	// adding them now brings them under the rules below.
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "help" && c.Args == nil {
			// Cobra's help prints the root's help for a topic that
			// does not exist and succeeds.
			c.Args = helpTopic
		}
	}
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
		if cmd.HasSubCommands() && !cmd.Runnable() {
			// A group: only its subcommands run. Cobra checks arguments
			// only of runnable commands, so the group gets a RunE that
			// shows its help when called bare.
			cmd.Args = unknownSubcommand
			cmd.RunE = func(cmd *cobra.Command, _ []string) error {
				// Flags given to a group apply to no command: --set
				// or --config with the command forgotten would be
				// dropped without a word (help, exit 0).
				var given []string
				cmd.Flags().Visit(func(f *pflag.Flag) { given = append(given, "--"+f.Name) })
				if len(given) > 0 {
					return Usage(cmd, "%s given without a command: name the command it is for (%s COMMAND %s ...)",
						strings.Join(given, ", "), cmd.CommandPath(), given[0])
				}
				return cmd.Help()
			}
		}
		if check := cmd.Args; check != nil {
			cmd.Args = func(cmd *cobra.Command, args []string) error {
				err := check(cmd, args)
				var ue *UsageError
				if err == nil || errors.As(err, &ue) {
					return err
				}
				return &UsageError{err: err, path: cmd.CommandPath()}
			}
		}
		// Cobra validates required flags after PreRunE, with plain errors:
		// validate them here first.
		preE, pre := cmd.PreRunE, cmd.PreRun
		cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
			if err := cmd.ValidateRequiredFlags(); err != nil {
				return &UsageError{err: err, path: cmd.CommandPath()}
			}
			if err := cmd.ValidateFlagGroups(); err != nil {
				return &UsageError{err: err, path: cmd.CommandPath()}
			}
			switch {
			case preE != nil:
				return preE(cmd, args)
			case pre != nil:
				pre(cmd, args)
			}
			return nil
		}
	}
	walk(root)
}

// NoArgs is the Args of a command that takes flags only. Unlike
// cobra.NoArgs, which calls an argument an "unknown command", it names
// the argument as a misplaced value (`webhooks add URL` for `--url URL`).
func NoArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return Usage(cmd, "takes no arguments, got %q (its inputs are flags, see --help)", args[0])
}

// helpTopic is the Args of the help command: each argument must name a
// subcommand of the one before it (`help webhooks add`).
func helpTopic(cmd *cobra.Command, args []string) error {
	topic := cmd.Root()
	for i, a := range args {
		var next *cobra.Command
		for _, sub := range topic.Commands() {
			if sub.Name() == a || sub.HasAlias(a) {
				next = sub
				break
			}
		}
		if next == nil {
			return Usage(cmd, "unknown help topic %q", strings.Join(args[:i+1], " "))
		}
		topic = next
	}
	return nil
}

// unknownSubcommand is the Args of a command group: any argument names a
// subcommand that does not exist.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's own default, set only on the root path it handles
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += " (did you mean " + strings.Join(s, " or ") + "?)"
	}
	return Usage(cmd, "%s", msg)
}
