package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/flotilla-io/flotilla/agent"
	"github.com/flotilla-io/flotilla/ipam"
)

func init() {
	register(command{
		name:    "ledger",
		summary: "inspect the ipam ledger (ledger show --state-dir DIR)",
		run:     runLedger,
	})
}

func runLedger(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "show" {
		fmt.Fprintln(stderr, "Usage: flotilla ledger show [--state-dir DIR]")
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return flag.ErrHelp
		}
		return errUsage
	}
	fs := newFlagSet("ledger show", stderr)
	stateDir := fs.String("state-dir", agent.DefaultConfig().StateDir, "the agent's state directory, holding "+ipam.FileName)
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	return showLedger(filepath.Join(*stateDir, ipam.FileName), stdout)
}

// showLedger prints the ledger read-only. A running agent holds the file's
// lock; then it prints a consistent snapshot of the agent's last committed
// transaction instead of waiting.
func showLedger(path string, w io.Writer) error {
	l, err := ipam.Open(path, ipam.Options{ReadOnly: true, LockTimeout: 300 * time.Millisecond})
	note := ""
	if errors.Is(err, ipam.ErrLocked) {
		l, err = ipam.OpenSnapshot(path)
		if err == nil {
			note = fmt.Sprintf("in use by a running agent: showing its last committed transaction (%d)", l.SnapshotTx())
		}
	}
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Fprintf(w, "ledger %s\n", path)
	if note != "" {
		fmt.Fprintf(w, "note: %s\n", note)
	}
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }

	section := func(title, header string, rows [][]any) {
		fmt.Fprintf(w, "\n%s\n", title)
		if len(rows) == 0 {
			fmt.Fprintln(w, "  (none)")
			return
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  %s\n", header)
		for _, r := range rows {
			for i, c := range r {
				if i == 0 {
					fmt.Fprint(tw, "  ")
				} else {
					fmt.Fprint(tw, "\t")
				}
				fmt.Fprint(tw, c)
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
	}

	var rows [][]any
	for _, n := range l.LocalNetworks() {
		rows = append(rows, []any{n.Range, n.Kind})
	}
	section("LOCAL NETWORKS", "RANGE\tKIND", rows)

	rows = nil
	for _, v := range l.Views("") {
		rows = append(rows, []any{v.Peer, v.Remote, v.View, ts(v.Since)})
	}
	section("MY VIEWS OF PEERS", "PEER\tTHEIR RANGE\tMY VIEW\tSINCE", rows)

	rows = nil
	for _, v := range l.TheirViews("") {
		rows = append(rows, []any{v.Peer, v.Mine, v.Theirs, ts(v.Since)})
	}
	section("THEIR VIEWS OF ME", "PEER\tMY RANGE\tTHEIR VIEW\tSINCE", rows)

	rows = nil
	for _, q := range l.Quarantine() {
		rows = append(rows, []any{q.Block, q.Peer, q.Remote, ts(q.Until)})
	}
	section("QUARANTINE", "BLOCK\tPEER\tTHEIR RANGE\tUNTIL", rows)

	if c := l.Conflicts(); len(c) > 0 {
		fmt.Fprintln(w, "\nCONFLICTS (the agent remaps these)")
		for _, x := range c {
			fmt.Fprintf(w, "  %s\n", x)
		}
	}
	return nil
}
