package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/flotilla-io/flotilla/internal/version"
	"github.com/flotilla-io/flotilla/peering/protocol"
)

func init() { register(newVersionCommand) }

func newVersionCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "version",
		GroupID: groupDiagnose,
		Short:   "print the version, commit and peering protocol range of this binary",
		Args:    noArgs,
	}
	o := outputFlag(cmd, objectFormats...)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		format, err := parseOutput(*o, objectFormats...)
		if err != nil {
			return err
		}
		b := protocol.Build()
		if format != outputTable {
			return writeJSONOrYAML(cmd.OutOrStdout(), b, format)
		}
		printVersion(cmd.OutOrStdout(), "client", b)
		return nil
	}
	return cmd
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
