package main

import (
	"bytes"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/ipam"
)

// fillLedger writes a small ledger whose clock is in 2100, so that its
// quarantine is still running when the command reads it.
func fillLedger(t *testing.T, dir string) *ipam.Ledger {
	t.Helper()
	now := time.Date(2100, 1, 2, 3, 4, 5, 0, time.UTC)
	l, err := ipam.Open(filepath.Join(dir, ipam.FileName), ipam.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	if _, err := l.SetLocalNetworks([]ipam.LocalNetwork{
		{Range: p("10.0.0.0/16"), Kind: ipam.PodNetwork},
		{Range: p("10.96.0.0/12"), Kind: ipam.ServiceNetwork},
	}); err != nil {
		t.Fatal(err)
	}
	steps := []error{
		func() error { _, err := l.ViewOf("cpeerb", p("10.0.0.0/16")); return err }(),
		func() error { _, err := l.ViewOf("cpeerb", p("172.20.0.0/16")); return err }(),
		func() error { _, err := l.ViewOf("cpeerc", p("10.0.0.0/16")); return err }(),
		l.Release("cpeerc", p("10.0.0.0/16")),
		l.RecordTheirView("cpeerb", p("10.0.0.0/16"), p("10.71.0.0/16")),
	}
	for _, err := range steps {
		if err != nil {
			t.Fatal(err)
		}
	}
	return l
}

const wantShow = `
LOCAL NETWORKS
  RANGE         KIND
  10.0.0.0/16   pods
  10.96.0.0/12  services

MY VIEWS OF PEERS
  PEER    THEIR RANGE    MY VIEW        SINCE
  cpeerb  10.0.0.0/16    100.96.0.0/16  2100-01-02T03:04:05Z
  cpeerb  172.20.0.0/16  172.20.0.0/16  2100-01-02T03:04:05Z

THEIR VIEWS OF ME
  PEER    MY RANGE     THEIR VIEW    SINCE
  cpeerb  10.0.0.0/16  10.71.0.0/16  2100-01-02T03:04:05Z

QUARANTINE
  BLOCK          PEER    THEIR RANGE  UNTIL
  100.97.0.0/16  cpeerc  10.0.0.0/16  2100-01-02T04:04:05Z
`

func TestLedgerShow(t *testing.T) {
	dir := t.TempDir()
	fillLedger(t, dir).Close()
	var out, errOut bytes.Buffer
	if code := run([]string{"ledger", "show", "--state-dir", dir}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	want := "ledger " + filepath.Join(dir, ipam.FileName) + "\n" + wantShow
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestLedgerShowWhileAgentHoldsIt(t *testing.T) {
	dir := t.TempDir()
	l := fillLedger(t, dir) // stays open, as in a running agent
	defer l.Close()
	var out, errOut bytes.Buffer
	if code := run([]string{"ledger", "show", "--state-dir", dir}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "note: in use by a running agent: showing its last committed transaction") ||
		!strings.HasSuffix(out.String(), wantShow) {
		t.Fatalf("output:\n%s", out.String())
	}
}

func TestLedgerShowErrors(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"ledger"}, 2, "flotilla ledger: say what to do"},
		{[]string{"ledger", "show", "--state-dir", "/nonexistent-flotilla"}, 1, "open ledger /nonexistent-flotilla/ledger.db"},
		{[]string{"ledger", "show", "extra"}, 2, `unexpected argument "extra"`},
	}
	for _, tc := range tests {
		var out, errOut bytes.Buffer
		code := run(tc.args, &out, &errOut)
		if code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}
}
