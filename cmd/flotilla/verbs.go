package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// withVerbs makes cmd a command of verbs: without one, or with one it
// does not know, it is a usage error that lists them.
func withVerbs(cmd *cobra.Command, verbs ...*cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.SuggestionsMinimumDistance = 2
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return usageError{err: errors.New("say what to do"), listVerbs: true}
		}
		return usageError{err: fmt.Errorf("unknown verb %q%s", args[0], didYouMean(cmd, args[0])), listVerbs: true}
	}
	cmd.AddCommand(verbs...)
	return cmd
}

// noArgs: the command takes flags only.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("unexpected argument %q", args[0])
	}
	return nil
}

// oneArg: the command takes one argument; without it, the usage error
// says missing.
func oneArg(missing string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		switch {
		case len(args) == 0:
			return usageErrorf("%s", missing)
		case len(args) > 1:
			return usageErrorf("unexpected argument %q", args[1])
		}
		return nil
	}
}

// didYouMean names the subcommands of cmd close to what was typed.
func didYouMean(cmd *cobra.Command, typed string) string {
	if s := cmd.SuggestionsFor(typed); len(s) > 0 {
		return "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return ""
}
