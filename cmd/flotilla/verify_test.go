package main

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload/mcs"
)

func TestViewOf(t *testing.T) {
	p := v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: "cbeta"}, Status: v1alpha1.PeerStatus{TheirNetworks: []v1alpha1.NetworkView{
		{Range: "10.0.0.0/16", As: "10.70.0.0/16"},
		{Range: "10.96.0.0/20", As: "100.64.16.0/20"},
	}}}
	for _, tc := range []struct{ ip, want, err string }{
		{ip: "10.0.2.7", want: "10.70.2.7"},
		{ip: "10.0.255.1", want: "10.70.255.1"},
		{ip: "10.96.15.200", want: "100.64.31.200"},
		{ip: "10.1.0.1", err: "has no view of 10.1.0.1"},
		{ip: "not-an-ip", err: "pod address"},
	} {
		got, err := viewOf(p, tc.ip)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("viewOf(%s): %v, want an error saying %q", tc.ip, err, tc.err)
		case tc.err == "" && (err != nil || got != netip.MustParseAddr(tc.want)):
			t.Errorf("viewOf(%s) = %s, %v; want %s", tc.ip, got, err, tc.want)
		}
	}
}

func TestGrantFrom(t *testing.T) {
	cond := func(status metav1.ConditionStatus, reason string) v1alpha1.Peer {
		return v1alpha1.Peer{Status: v1alpha1.PeerStatus{Conditions: []metav1.Condition{
			{Type: v1alpha1.ConditionOffloadGranted, Status: metav1.ConditionTrue},
			{Type: v1alpha1.ConditionOffloadCredential, Status: status, Reason: reason, Message: "m"},
		}}}
	}
	if ok, _ := grantFrom(cond(metav1.ConditionTrue, "Ready")); !ok {
		t.Errorf("OffloadCredential True: not granted")
	}
	// OffloadGranted is the other way (this cluster as the provider): it
	// is no grant to offload there.
	if ok, why := grantFrom(cond(metav1.ConditionFalse, "AwaitingOptIn")); ok || why != "AwaitingOptIn: m" {
		t.Errorf("OffloadCredential False: %v, %q", ok, why)
	}
	if ok, why := grantFrom(v1alpha1.Peer{}); ok || !strings.Contains(why, "no OffloadCredential") {
		t.Errorf("no condition: %v, %q", ok, why)
	}
}

func TestProbeTargetArgument(t *testing.T) {
	in := probeTarget{Name: "pod to pod", URL: "http://10.70.0.5:8080/", Pod: "server-b"}
	got, err := parseProbeTarget(in.String())
	if err != nil || got != in {
		t.Errorf("parse(%q) = %+v, %v", in.String(), got, err)
	}
	for _, bad := range []string{"", "name", "name=url", "=http://x=pod", "name==pod", "name=http://x="} {
		if _, err := parseProbeTarget(bad); err == nil {
			t.Errorf("parse(%q): no error", bad)
		}
	}
}

// The server names itself; a probe passes when that pod answers and
// fails, saying what answered, when another does or nothing does.
func TestProbeAgainstServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var served bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- serveVerify(ctx, &served, l) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	host, _ := os.Hostname()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closed.Close()
	url := "http://" + l.Addr().String() + "/"
	var out bytes.Buffer
	runProbes(t.Context(), &out, []probeTarget{
		{Name: "right", URL: url, Pod: host},
		{Name: "wrong", URL: url, Pod: "another"},
		{Name: "none", URL: "http://" + closed.Addr().String() + "/", Pod: host},
	}, 2*time.Second)
	results, other := parseProbeOutput(out.String())
	if len(other) != 0 || len(results) != 3 {
		t.Fatalf("probe output %q: %v, %v", out.String(), results, other)
	}
	if r := results["right"]; !r.OK || !strings.Contains(r.Detail, "saw the caller as 127.0.0.1") {
		t.Errorf("right: %+v", r)
	}
	if r := results["wrong"]; r.OK || !strings.Contains(r.Detail, "answered by "+host+", not another") {
		t.Errorf("wrong: %+v", r)
	}
	if r := results["none"]; r.OK || !strings.Contains(r.Detail, "no answer from") {
		t.Errorf("none: %+v", r)
	}
	if !strings.HasPrefix(served.String(), verifyServingLine) {
		t.Errorf("the server's first line %q, want %q first", served.String(), verifyServingLine)
	}
}

func TestParseProbeOutput(t *testing.T) {
	results, other := parseProbeOutput("{\"name\":\"a\",\"ok\":true,\"detail\":\"d\"}\nexec /flotilla: no such file\n\n{\"ok\":true}\n")
	if len(results) != 1 || !results["a"].OK || len(other) != 2 {
		t.Errorf("results %+v, other %q", results, other)
	}
}

// What another cluster's pod wrote is read without a panic, and every
// line is either a result or kept as said.
func FuzzParseProbeOutput(f *testing.F) {
	f.Add("{\"name\":\"a\",\"ok\":true,\"detail\":\"d\"}\nnoise\n")
	f.Add("{\"name\":\"\"}")
	f.Add("{")
	f.Fuzz(func(t *testing.T, log string) {
		results, other := parseProbeOutput(log)
		lines := 0
		for _, l := range strings.Split(log, "\n") {
			if strings.TrimSpace(l) != "" {
				lines++
			}
		}
		if len(results) > lines || len(other) > lines {
			t.Errorf("%d results and %d other lines from %d lines", len(results), len(other), lines)
		}
	})
}

func TestVerifyTable(t *testing.T) {
	r := verifyReport{Local: "alpha", Remote: "beta", Namespace: "verify-flotilla-x", Seconds: 12.3, CleanedUp: true, Checks: []verifyCheck{
		{Name: checkPodsAB, From: "alpha pod", To: "beta pod", Result: checkFail, Detail: "GET http://10.70.0.5:8080/: no answer"},
		{Name: checkOffload, From: "alpha pod", To: "alpha pod offloaded to beta", Result: checkSkipped, Detail: "skipped: no grant from beta"},
	}}
	var out bytes.Buffer
	if err := writeVerifyTable(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CHECK", "pod to pod  ", "FAIL", "SKIPPED  skipped: no grant from beta", "FAILED (1 of 2 checks): alpha to beta in 12.3s; namespace verify-flotilla-x deleted"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	t.Logf("\n%s", out.String())
}

func TestClustersetZone(t *testing.T) {
	if want := strings.TrimSuffix(mcs.Zone, "."); clustersetZone != want {
		t.Fatalf("clustersetZone %q, want offload/mcs's %q", clustersetZone, want)
	}
}
