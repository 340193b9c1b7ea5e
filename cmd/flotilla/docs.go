package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func init() { register(newDocsCommand) }

// newDocsCommand prints docs/cli.md (make docs): the reference of every
// command, from the commands' own help, so that it cannot drift.
func newDocsCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "docs",
		Short:  "print the command line reference (docs/cli.md) in Markdown",
		Hidden: true,
		Args:   noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return writeDocs(cmd.OutOrStdout())
		},
	}
}

const docsIntro = `# The flotilla command line

<!-- Generated from the commands' help by ` + "`make docs`" + `: edit the commands, not this file. -->

One binary, ` + "`flotilla`" + `: the agent of each cluster (` + "`flotilla agent`" + `), the
fabric of each node (` + "`flotilla fabric`" + `), both run by the install in
` + "`deploy/`" + `, and the commands an operator runs. They follow kubectl's habits:

- Names and flags in any order: ` + "`flotilla grant --cpu 4 beta`" + ` is
  ` + "`flotilla grant beta --cpu 4`" + `.
- Every command that talks to a cluster takes ` + "`--kubeconfig`" + ` (default:
  ` + "`$KUBECONFIG`" + `, else ` + "`~/.kube/config`" + `) and ` + "`--context`" + ` (default: the
  kubeconfig's current context).
- Every command that reads takes ` + "`-o json`" + ` and ` + "`-o yaml`" + `; with ` + "`-o`" + `,
  a command that changes something prints the object on stdout and its
  progress on stderr.
- Every command that waits for the agent takes ` + "`--wait`" + ` (default 1m; ` + "`0`" + `:
  do not wait).
- ` + "`-h`" + ` is always help. Exit status: 0 done, 1 failed, 2 the command line is
  wrong.

Installed on ` + "`PATH`" + ` as ` + "`kubectl-flotilla`" + ` (` + "`make build`" + ` makes
` + "`bin/kubectl-flotilla`" + `), the binary is the kubectl plugin ` + "`kubectl flotilla`" + `,
the same commands. Shell completion: ` + "`source <(flotilla completion bash)`" + `
(or ` + "`zsh`" + `, ` + "`fish`" + `); for ` + "`kubectl flotilla`" + `, put ` + "`bin/kubectl_complete-flotilla`" + `
on ` + "`PATH`" + ` too.
`

// writeDocs writes the reference of every command, in the order help
// lists them.
func writeDocs(w io.Writer) error {
	root := newRoot()
	root.Annotations[cobra.CommandDisplayNameAnnotation] = "flotilla"
	root.InitDefaultCompletionCmd()
	var b strings.Builder
	b.WriteString(docsIntro)
	b.WriteString("\n## Commands\n\n")
	cmds := documented(root)
	for _, c := range cmds[1:] {
		fmt.Fprintf(&b, "- [`%s`](#%s): %s\n", c.CommandPath(), anchor(c.CommandPath()), c.Short)
	}
	for _, c := range cmds[1:] {
		writeCommand(&b, c)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// documented is root and every command under it a user runs.
func documented(c *cobra.Command) []*cobra.Command {
	if c.Hidden || c.Name() == "help" {
		return nil
	}
	out := []*cobra.Command{c}
	for _, sub := range c.Commands() {
		out = append(out, documented(sub)...)
	}
	return out
}

func writeCommand(b *strings.Builder, c *cobra.Command) {
	fmt.Fprintf(b, "\n## %s\n\n", c.CommandPath())
	text := c.Long
	if text == "" {
		text = strings.ToUpper(c.Short[:1]) + c.Short[1:] + "."
	}
	fmt.Fprintf(b, "%s\n\n```\n", strings.TrimSpace(text))
	if c.Runnable() && !c.HasAvailableSubCommands() {
		fmt.Fprintf(b, "%s\n", c.UseLine())
	}
	if c.HasAvailableSubCommands() {
		fmt.Fprintf(b, "%s <verb>\n", c.CommandPath())
	}
	fmt.Fprintf(b, "```\n")
	if c.HasAvailableSubCommands() {
		b.WriteString("\n| verb | what it does |\n| --- | --- |\n")
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				fmt.Fprintf(b, "| [`%s`](#%s) | %s |\n", sub.Name(), anchor(sub.CommandPath()), strings.ReplaceAll(sub.Short, "|", `\|`))
			}
		}
	}
	var rows []string
	c.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" || f.Hidden || f.Deprecated != "" {
			return
		}
		kind, usage := pflag.UnquoteUsage(f)
		name := "`--" + strings.TrimSpace(f.Name+" "+kind) + "`"
		if f.Shorthand != "" {
			name = "`-" + f.Shorthand + "`, " + name
		}
		def := ""
		if !zeroDefault(f) {
			def = "`" + f.DefValue + "`"
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s |", name, def, markdownCell(usage)))
	})
	if len(rows) > 0 {
		fmt.Fprintf(b, "\n| flag | default | |\n| --- | --- | --- |\n%s\n", strings.Join(rows, "\n"))
	}
}

// zeroDefault: the flag's default is its type's zero, which help does not
// print either.
func zeroDefault(f *pflag.Flag) bool {
	switch f.DefValue {
	case "", "0", "false", "[]", "0s":
		return true
	}
	return false
}

// markdownCell escapes what would end a table cell or start code.
func markdownCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// anchor is the link GitHub makes of a heading.
func anchor(heading string) string {
	return strings.ReplaceAll(strings.ToLower(heading), " ", "-")
}
