package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/flotilla-io/flotilla/agent"
)

func init() { register(newVersionCommand) }

// buildInfo is this binary's build, as version -o json|yaml prints it.
type buildInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

func thisBuild() buildInfo {
	return buildInfo{Version: agent.Version, Commit: agent.BuildCommit(), GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
}

func newVersionCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "version",
		GroupID: groupDiagnose,
		Short:   "print the version of this binary",
		Args:    noArgs,
	}
	o := outputFlag(cmd, objectFormats...)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		format, err := parseOutput(*o, objectFormats...)
		if err != nil {
			return err
		}
		b := thisBuild()
		if format != outputTable {
			return writeJSONOrYAML(cmd.OutOrStdout(), b, format)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "flotilla %s (commit %s, %s, %s)\n", b.Version, b.Commit, b.GoVersion, b.Platform)
		return nil
	}
	return cmd
}
