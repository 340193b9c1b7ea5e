package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/flotilla-io/flotilla/agent/agentapi"
)

func init() {
	register(newTokenCommand)
}

func newTokenCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "token",
		GroupID: groupFederation,
		Short:   "print a join token that lets another cluster join this federation (a secret)",
		Args:    noArgs,
	}
	stateDir := cmd.Flags().String("state-dir", agentapi.DefaultStateDir, "the agent's state directory")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		tok, err := agentapi.JoinToken(*stateDir)
		if err != nil {
			return err
		}
		fmt.Fprintln(cmd.OutOrStdout(), tok)
		return nil
	}
	return cmd
}
