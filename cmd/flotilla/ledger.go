//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/flotilla-io/flotilla/agent"
	"github.com/flotilla-io/flotilla/ipam"
)

func init() { register(newLedgerCommand) }

func newLedgerCommand() *cobra.Command {
	show := &cobra.Command{
		Use:   "show",
		Short: "the ledger, read-only: local networks, views both ways, quarantine, conflicts (-o json|yaml)",
		Args:  noArgs,
	}
	stateDir := show.Flags().String("state-dir", agent.DefaultConfig().StateDir, "the agent's state directory, holding "+ipam.FileName)
	o := outputFlag(show, objectFormats...)
	show.RunE = func(cmd *cobra.Command, _ []string) error {
		format, err := parseOutput(*o, objectFormats...)
		if err != nil {
			return err
		}
		return showLedger(filepath.Join(*stateDir, ipam.FileName), format, cmd.OutOrStdout())
	}
	return withVerbs(&cobra.Command{
		Use:     "ledger",
		GroupID: groupDiagnose,
		Short:   "inspect the ipam ledger on the gateway host (ledger show --state-dir DIR)",
	}, show)
}

// ledgerReport is the ledger as ledger show -o json|yaml prints it.
type ledgerReport struct {
	Path string `json:"path"`
	// SnapshotTx is the agent's last committed transaction shown when a
	// running agent holds the ledger; 0 otherwise.
	SnapshotTx    uint64             `json:"snapshotTx,omitempty"`
	LocalNetworks []ledgerNetwork    `json:"localNetworks"`
	Views         []ledgerView       `json:"views"`
	TheirViews    []ledgerView       `json:"theirViews"`
	Quarantine    []ledgerQuarantine `json:"quarantine"`
	Conflicts     []string           `json:"conflicts,omitempty"`
}

type ledgerNetwork struct {
	Range netip.Prefix     `json:"range"`
	Kind  ipam.NetworkKind `json:"kind"`
}

// ledgerView is one range of Peer's: Theirs as they address it, Ours as
// this cluster does.
type ledgerView struct {
	Peer   string       `json:"peer"`
	Theirs netip.Prefix `json:"theirs"`
	Ours   netip.Prefix `json:"ours"`
	Since  time.Time    `json:"since"`
}

type ledgerQuarantine struct {
	Block  netip.Prefix `json:"block"`
	Peer   string       `json:"peer"`
	Theirs netip.Prefix `json:"theirs"`
	Until  time.Time    `json:"until"`
}

func reportLedger(path string, l *ipam.Ledger) ledgerReport {
	r := ledgerReport{Path: path, SnapshotTx: l.SnapshotTx(), LocalNetworks: []ledgerNetwork{}, Views: []ledgerView{}, TheirViews: []ledgerView{}, Quarantine: []ledgerQuarantine{}}
	for _, n := range l.LocalNetworks() {
		r.LocalNetworks = append(r.LocalNetworks, ledgerNetwork{n.Range, n.Kind})
	}
	for _, v := range l.Views("") {
		r.Views = append(r.Views, ledgerView{Peer: v.Peer, Theirs: v.Remote, Ours: v.View, Since: v.Since.UTC()})
	}
	// Their view of our range: ours as we address it, theirs as they do.
	for _, v := range l.TheirViews("") {
		r.TheirViews = append(r.TheirViews, ledgerView{Peer: v.Peer, Theirs: v.Theirs, Ours: v.Mine, Since: v.Since.UTC()})
	}
	for _, q := range l.Quarantine() {
		r.Quarantine = append(r.Quarantine, ledgerQuarantine{Block: q.Block, Peer: q.Peer, Theirs: q.Remote, Until: q.Until.UTC()})
	}
	for _, c := range l.Conflicts() {
		r.Conflicts = append(r.Conflicts, c.String())
	}
	return r
}

// showLedger prints the ledger read-only. A running agent holds the file's
// lock; then it prints a consistent snapshot of the agent's last committed
// transaction instead of waiting.
func showLedger(path string, format output, w io.Writer) error {
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
	if format != outputTable {
		return writeJSONOrYAML(w, reportLedger(path, l), format)
	}
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
