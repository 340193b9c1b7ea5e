package main

import (
	"context"
	"fmt"
	"io"
	"runtime"

	"github.com/flotilla-io/flotilla/agent"
)

func init() {
	register(command{
		name:    "version",
		summary: "print the version of this binary",
		run: func(_ context.Context, args []string, stdout, stderr io.Writer) error {
			fs := newFlagSet("version", stderr)
			if err := parseFlags(fs, args); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "flotilla %s (commit %s, %s, %s/%s)\n",
				agent.Version, agent.BuildCommit(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	})
}
