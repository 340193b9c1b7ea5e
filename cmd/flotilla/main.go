// Command flotilla is the one Flotilla binary: the agent and the operator
// commands. Each command lives in its own file, built by a constructor
// that file registers.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// commands are the constructors of the top-level commands. The tree is
// built afresh for every run, so that no flag value outlives it.
var commands []func() *cobra.Command

// register adds a top-level command: a file calls it from init with the
// constructor of its command.
func register(newCommand func() *cobra.Command) {
	commands = append(commands, newCommand)
}

// The groups the top-level commands are listed in; a command names one
// as its GroupID.
const (
	groupFederation = "federation"
	groupOffload    = "offload"
	groupDiagnose   = "diagnose"
	groupNode       = "node"
)

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
	args := os.Args[1:]
	if completesPlugin(os.Args[0]) {
		// kubectl asks the plugin's completions of this program, with
		// the words after "kubectl flotilla": cobra's own request.
		args = append([]string{cobra.ShellCompRequestCmd}, args...)
	}
	os.Exit(run(args, os.Stdout, os.Stderr))
}

// programName is "kubectl flotilla" when argv[0] is the plugin's name
// (or the name of its completion, kubectl_complete-flotilla), else
// "flotilla".
func programName(argv0 string) string {
	switch strings.TrimSuffix(filepath.Base(argv0), ".exe") {
	case "kubectl-flotilla", "kubectl_complete-flotilla":
		return "kubectl flotilla"
	}
	return "flotilla"
}

// completesPlugin: argv[0] is kubectl_complete-flotilla, which kubectl
// runs to complete the words after "kubectl flotilla".
func completesPlugin(argv0 string) bool {
	return strings.TrimSuffix(filepath.Base(argv0), ".exe") == "kubectl_complete-flotilla"
}

// run runs the command line args with a context cancelled on SIGINT or
// SIGTERM and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return runIn(ctx, args, stdout, stderr)
}

// runIn runs args and returns the exit status: 0 when done (help
// included), 2 for a usage error, 1 for any other error.
func runIn(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var usage usageError
	switch {
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), err)
		if usage.listVerbs {
			fmt.Fprintf(stderr, "\n%s", cmd.UsageString())
		} else {
			fmt.Fprintf(stderr, "Run '%s -h' for help.\n", cmd.CommandPath())
		}
		return 2
	case errors.Is(err, errReported):
	default:
		fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), err)
	}
	return 1
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "flotilla",
		Short: "Flotilla: a peer-to-peer federation of Kubernetes clusters",
		Long: `Flotilla: a peer-to-peer federation of Kubernetes clusters.

One binary: the agent of each cluster, the fabric of each node, and the
commands an operator runs against a cluster with a kubeconfig, as kubectl
does (--kubeconfig, --context; -o json|yaml on every command that reads).
Installed as kubectl-flotilla on PATH, it is also "kubectl flotilla".`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: progName},
		SilenceErrors: true,
		SilenceUsage:  true,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			return usageError{err: fmt.Errorf("unknown command %q%s", args[0], didYouMean(cmd, args[0])), listVerbs: true}
		},
		RunE: func(*cobra.Command, []string) error {
			return usageError{err: errors.New("say which command to run"), listVerbs: true}
		},
	}
	root.SuggestionsMinimumDistance = 2
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err: err} })
	root.AddGroup(
		&cobra.Group{ID: groupFederation, Title: "The federation:"},
		&cobra.Group{ID: groupOffload, Title: "Offloading:"},
		&cobra.Group{ID: groupDiagnose, Title: "Diagnosis:"},
		&cobra.Group{ID: groupNode, Title: "Run on a cluster or host:"},
	)
	for _, newCommand := range commands {
		root.AddCommand(newCommand())
	}
	return root
}

// usageError is a command line the command cannot run: exit status 2.
// listVerbs: the usage, with the verbs, follows the error.
type usageError struct {
	err       error
	listVerbs bool
}

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usageErrorf(format string, a ...any) error {
	return usageError{err: fmt.Errorf(format, a...)}
}

// errReported: the command has already said what went wrong; the exit
// status says so to scripts.
var errReported = errors.New("reported")
