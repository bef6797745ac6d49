package testsupport

import (
	"bytes"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// DocCommand is one command line of a program shown in a Markdown file:
// the words after the program's name, up to the first shell operator.
type DocCommand struct {
	File string
	Line int
	Args []string
}

// shellFence is the info string of a fenced block read as shell: none, or
// a shell's name. Other blocks (go, yaml, json) hold no command lines.
var shellFence = map[string]bool{"": true, "sh": true, "bash": true, "shell": true, "console": true}

// inlineCode matches a Markdown code span.
var inlineCode = regexp.MustCompile("`([^`]+)`")

// DocCommands returns every command line of program ("appview",
// "appview-dev") that files show, in fenced shell blocks and in code
// spans: the program by its name or a path ending in it (bin/appview),
// or `go run ./cmd/PROGRAM`, each at the start of a command.
func DocCommands(t testing.TB, program string, files ...string) []DocCommand {
	t.Helper()
	var out []DocCommand
	for _, file := range files {
		body, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		inFence, shell := false, false
		pending, pendingLine := "", 0
		for i, line := range strings.Split(string(body), "\n") {
			trimmed := strings.TrimSpace(line)
			if strings.HasPrefix(trimmed, "```") {
				inFence = !inFence
				shell = inFence && shellFence[strings.TrimSpace(strings.TrimPrefix(trimmed, "```"))]
				continue
			}
			if !inFence {
				for _, m := range inlineCode.FindAllStringSubmatch(line, -1) {
					out = append(out, commandsIn(program, m[1], file, i+1)...)
				}
				continue
			}
			if !shell {
				continue
			}
			if pending == "" {
				pendingLine = i + 1
			}
			if cont, ok := strings.CutSuffix(trimmed, `\`); ok {
				pending += cont + " "
				continue
			}
			out = append(out, commandsIn(program, pending+trimmed, file, pendingLine)...)
			pending = ""
		}
	}
	return out
}

// commandsIn returns the command lines of program in one shell line.
func commandsIn(program, line, file string, n int) []DocCommand {
	if i := strings.Index(line, " #"); i >= 0 {
		line = line[:i]
	}
	line = strings.TrimPrefix(strings.TrimSpace(line), "$ ")
	for _, op := range []string{"&&", "||", "|", ";", "&", "(", ")"} {
		line = strings.ReplaceAll(line, op, " \x00 ")
	}
	var out []DocCommand
	for _, simple := range strings.Split(line, "\x00") {
		if args, ok := programArgs(program, strings.Fields(simple)); ok {
			out = append(out, DocCommand{File: file, Line: n, Args: args})
		}
	}
	return out
}

var envAssignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// programArgs returns the arguments of program when the simple command
// fields runs it.
func programArgs(program string, fields []string) ([]string, bool) {
	for len(fields) > 0 && envAssignment.MatchString(fields[0]) {
		fields = fields[1:]
	}
	if len(fields) == 0 {
		return nil, false
	}
	if fields[0] == "go" {
		if len(fields) < 2 || fields[1] != "run" {
			return nil, false
		}
		for i := 2; i < len(fields); i++ {
			if strings.HasPrefix(fields[i], "-") {
				continue
			}
			if fields[i] == "./cmd/"+program || strings.HasSuffix(fields[i], "/cmd/"+program) {
				return fields[i+1:], true
			}
			return nil, false
		}
		return nil, false
	}
	isProgram := func(f string) bool {
		f = strings.Trim(f, `"'`)
		return f == program || strings.HasSuffix(f, "/"+program)
	}
	switch fields[0] {
	case "sudo", "exec", "nohup", "time", "env", "timeout", "setsid":
		// A wrapper: the program is the first field that names it.
		for i := 1; i < len(fields); i++ {
			if isProgram(fields[i]) {
				return fields[i+1:], true
			}
		}
		return nil, false
	}
	if isProgram(fields[0]) {
		return fields[1:], true
	}
	return nil, false
}

var commandWord = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

// CheckDocCommands fails t for every command line of program that files
// show naming a command the tree newRoot builds does not have, a command
// that does not answer --help with success, or a flag the command does
// not take. It fails too when files show no command line of program at
// all, so a broken reader cannot pass for a clean page.
func CheckDocCommands(t testing.TB, program string, newRoot func() *cobra.Command, files ...string) {
	t.Helper()
	cmds := DocCommands(t, program, files...)
	if len(cmds) == 0 {
		t.Fatalf("%v show no %s command line", files, program)
	}
	for _, dc := range cmds {
		where := dc.File + ":" + strconv.Itoa(dc.Line)
		root := newRoot()
		// The command path: leading words naming subcommands.
		var path []string
		cur, unknown := root, false
		for _, a := range dc.Args {
			a = strings.Trim(a, "[]")
			if !commandWord.MatchString(a) {
				break
			}
			next := subcommand(cur, a)
			if next == nil {
				if unknown = cur.HasSubCommands(); unknown {
					t.Errorf("%s: %s %s: %q is no command of %q", where, program, strings.Join(dc.Args, " "), a, cur.CommandPath())
				}
				break
			}
			path, cur = append(path, a), next
		}
		if unknown {
			continue
		}
		var buf bytes.Buffer
		root.SetOut(&buf)
		root.SetErr(&buf)
		root.SetArgs(append(append([]string{}, path...), "--help"))
		if err := root.Execute(); err != nil || !strings.Contains(buf.String(), "Usage:") {
			t.Errorf("%s: %s %s --help: %v\n%s", where, program, strings.Join(path, " "), err, buf.String())
			continue
		}
		for _, a := range dc.Args {
			name, ok := flagName(a)
			if !ok {
				continue
			}
			if !hasFlag(cur, name) {
				t.Errorf("%s: %s takes no flag %s", where, cur.CommandPath(), a)
			}
		}
	}
}

func subcommand(c *cobra.Command, name string) *cobra.Command {
	for _, sub := range c.Commands() {
		if sub.Name() == name || sub.HasAlias(name) {
			return sub
		}
	}
	return nil
}

// flagName returns the flag an argument names: "--only" of "--only=x" or
// "[--only", "h" of "-h"; not "-" (standard input) nor a negative number.
func flagName(arg string) (string, bool) {
	arg = strings.Trim(arg, "[],")
	if name, ok := strings.CutPrefix(arg, "--"); ok && name != "" {
		name, _, _ = strings.Cut(name, "=")
		return name, true
	}
	if name, ok := strings.CutPrefix(arg, "-"); ok && len(name) == 1 && name[0] >= 'a' && name[0] <= 'z' {
		return name, true
	}
	return "", false
}

// hasFlag reports whether c takes the flag name (long, or a one-letter
// shorthand), its own or inherited.
func hasFlag(c *cobra.Command, name string) bool {
	if len(name) == 1 {
		return c.Flags().ShorthandLookup(name) != nil || c.InheritedFlags().ShorthandLookup(name) != nil
	}
	return c.Flag(name) != nil
}
