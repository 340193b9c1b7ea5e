package main

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

func TestGrantLimits(t *testing.T) {
	for _, tc := range []struct {
		name          string
		cpu, memory   string
		pods, ns      int64
		want, wantErr string
	}{
		{name: "none", want: "<nil>"},
		{name: "all", cpu: "500m", memory: "8Gi", pods: 20, ns: 3, want: "cpu=500m memory=8Gi pods=20 namespaces=3"},
		{name: "cpu only", cpu: "4", want: "cpu=4"},
		{name: "bad cpu", cpu: "four", wantErr: "--cpu \"four\""},
		{name: "negative memory", memory: "-1Gi", wantErr: "--memory"},
		{name: "negative pods", pods: -1, wantErr: "--pods -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := grantLimits(tc.cpu, tc.memory, tc.pods, tc.ns)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("grantLimits: %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := describeLimits(l); got != tc.want {
				t.Errorf("limits %s, want %s", got, tc.want)
			}
		})
	}
}

func describeLimits(l *v1alpha1.OffloadLimits) string {
	if l == nil {
		return "<nil>"
	}
	var parts []string
	if l.CPU != nil {
		parts = append(parts, "cpu="+l.CPU.String())
	}
	if l.Memory != nil {
		parts = append(parts, "memory="+l.Memory.String())
	}
	if l.Pods != nil {
		parts = append(parts, "pods="+strconv.FormatInt(*l.Pods, 10))
	}
	if l.Namespaces != nil {
		parts = append(parts, "namespaces="+strconv.FormatInt(*l.Namespaces, 10))
	}
	return strings.Join(parts, " ")
}

// flotilla status shows both directions of offloading by their reasons.
func TestStatusShowsOffloading(t *testing.T) {
	var out bytes.Buffer
	writePeers(&out, []v1alpha1.Peer{{
		ObjectMeta: metav1.ObjectMeta{Name: "cabc"},
		Status: v1alpha1.PeerStatus{ClusterName: "b", Phase: v1alpha1.PhaseConnected, Conditions: []metav1.Condition{
			{Type: v1alpha1.ConditionOffloadGranted, Reason: "Granted"},
			{Type: v1alpha1.ConditionOffloadCredential, Reason: "Revoked"},
		}},
	}}, outputTable, peerStatusColumns, time.Now())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasSuffix(strings.TrimSpace(lines[0]), "HOSTING  OFFLOAD  TRAFFIC") ||
		!strings.HasSuffix(strings.TrimSpace(lines[1]), "Granted  Revoked  -") {
		t.Errorf("flotilla status:\n%s", out.String())
	}
}

// flotilla status shows the traffic mode in effect and, Segregated, what
// the peer may reach.
func TestStatusShowsTraffic(t *testing.T) {
	for _, tc := range []struct {
		status v1alpha1.PeerStatus
		want   string
	}{
		{v1alpha1.PeerStatus{}, "-"},
		{v1alpha1.PeerStatus{Traffic: v1alpha1.TrafficFull}, "Full"},
		{v1alpha1.PeerStatus{Traffic: v1alpha1.TrafficSegregated, Allowed: &v1alpha1.TrafficAllowed{Pods: 3, Services: 12}},
			"Segregated (3 pods, 12 service endpoints)"},
	} {
		var out bytes.Buffer
		tc.status.ClusterName = "b"
		writePeers(&out, []v1alpha1.Peer{{ObjectMeta: metav1.ObjectMeta{Name: "cabc"}, Status: tc.status}}, outputTable, peerStatusColumns, time.Now())
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 2 || !strings.HasSuffix(strings.TrimSpace(lines[1]), "  "+tc.want) {
			t.Errorf("status %+v: flotilla status:\n%s\nwant the row to end in %q", tc.status, out.String(), tc.want)
		}
	}
}
