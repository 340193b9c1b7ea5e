package main

import (
	"context"
	"flag"
	"fmt"
	"io"
)

// verb is a subcommand of a command with verbs (peer, key).
type verb struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// runVerbs runs the verb args[0] of command cmd, or prints usage (the
// verbs with their summaries between synopsis and trailer) and returns
// flag.ErrHelp when help was asked for, errUsage otherwise.
func runVerbs(ctx context.Context, cmd, synopsis, trailer string, verbs []verb, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		for _, v := range verbs {
			if v.name == args[0] {
				return v.run(ctx, args[1:], stdout, stderr)
			}
		}
	}
	help := len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help")
	if !help {
		what := "say what to do"
		if len(args) > 0 {
			what = fmt.Sprintf("unknown verb %q", args[0])
		}
		fmt.Fprintf(stderr, "%s %s: %s\n\n", progName, cmd, what)
	}
	width := 0
	for _, v := range verbs {
		width = max(width, len(v.name))
	}
	fmt.Fprintf(stderr, "Usage: %s %s %s\n\nVerbs:\n", progName, cmd, synopsis)
	for _, v := range verbs {
		fmt.Fprintf(stderr, "  %-*s %s\n", width+2, v.name, v.summary)
	}
	fmt.Fprintf(stderr, "\n%s\n", trailer)
	if help {
		return flag.ErrHelp
	}
	return errUsage
}
