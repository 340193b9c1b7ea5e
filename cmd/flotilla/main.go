// Command flotilla is the one Flotilla binary: the agent and the operator
// commands. Each subcommand lives in its own file and registers itself.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"syscall"
)

// command is one subcommand. run receives the arguments after the
// subcommand's name and a context cancelled on SIGINT or SIGTERM.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("flotilla: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// errUsage reports a usage error already explained to the user.
var errUsage = errors.New("usage error")

// progName is how the user called us, for usage text and errors:
// "flotilla", or "kubectl flotilla" when run as the kubectl plugin
// kubectl-flotilla (kubectl finds plugins by that name on PATH).
var progName = "flotilla"

func main() {
	// No heap profile is read unless the agent serves it (--profiling,
	// which sets a rate of its own). Sampling costs the profiler's
	// table of stacks (1.4 MB, its pages touched as samples hash into
	// it) and a walk of the stack every 512 KiB allocated, through
	// function tables that then stay mapped.
	runtime.MemProfileRate = 0
	progName = programName(os.Args[0])
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// programName is "kubectl flotilla" when argv[0] is the plugin's name,
// else "flotilla".
func programName(argv0 string) string {
	if base := filepath.Base(argv0); base == "kubectl-flotilla" || base == "kubectl-flotilla.exe" {
		return "kubectl flotilla"
	}
	return "flotilla"
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n", progName, args[0])
		usage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := c.run(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if errors.Is(err, errUsage) {
			return 2
		}
		fmt.Fprintf(stderr, "%s %s: %v\n", progName, c.name, err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s <command> [flags]\n", progName)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Run '%s <command> -h' for the flags of a command.\n", progName)
}

// newFlagSet returns a flag set whose errors and help go to stderr and are
// returned rather than exiting, so commands stay testable.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(progName+" "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args and rejects stray positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return errUsage
	}
	return nil
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return fmt.Sprint([]string(*l)) }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }
