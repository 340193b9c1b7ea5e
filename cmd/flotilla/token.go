package main

import (
	"context"
	"fmt"
	"io"

	"github.com/flotilla-io/flotilla/agent"
)

func init() {
	register(command{
		name:    "token",
		summary: "print a join token that lets another cluster join this federation (a secret)",
		run: func(_ context.Context, args []string, stdout, stderr io.Writer) error {
			fs := newFlagSet("token", stderr)
			stateDir := fs.String("state-dir", agent.DefaultConfig().StateDir, "the agent's state directory")
			if err := parseFlags(fs, args); err != nil {
				return err
			}
			tok, err := agent.JoinToken(*stateDir)
			if err != nil {
				return err
			}
			fmt.Fprintln(stdout, tok)
			return nil
		},
	})
}
