package main

import (
	"context"
	"fmt"
	"io"

	"github.com/flotilla-io/flotilla/agent"
	"github.com/flotilla-io/flotilla/internal/version"
)

func init() {
	register(command{
		name:    "version",
		summary: "print the version, commit and peering protocol range of this binary",
		run: func(_ context.Context, args []string, stdout, stderr io.Writer) error {
			fs := newFlagSet("version", stderr)
			if err := parseFlags(fs, args); err != nil {
				return err
			}
			printVersion(stdout, "client", agent.Build())
			return nil
		},
	})
}

// printVersion writes one build as the lines `flotilla version` prints,
// under a heading that says whose it is (the client, or an agent).
func printVersion(w io.Writer, whose string, b version.Info) {
	fmt.Fprintf(w, "%s:\n", whose)
	fmt.Fprintf(w, "  version:  %s\n", b.Version)
	fmt.Fprintf(w, "  commit:   %s\n", b.Commit)
	if b.Date != "" {
		fmt.Fprintf(w, "  date:     %s\n", b.Date)
	}
	fmt.Fprintf(w, "  go:       %s %s\n", b.GoVersion, b.Platform)
	fmt.Fprintf(w, "  protocol: %d (reads %d to %d)\n", b.Protocol.Current, b.Protocol.Min, b.Protocol.Max)
}
