package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/harness"
)

func TestParseSelector(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    string // MatchLabels and MatchExpressions, printed
		wantErr string
	}{
		{in: "", wantErr: "--selector is required"},
		{in: "  ", wantErr: "--selector is required"},
		{in: "region=a", want: "map[region:a] []"},
		{in: "region=a,tier=edge", want: "map[region:a tier:edge] []"},
		{in: "region==a", want: "map[region:a] []"},
		{in: "region in (a,b)", want: "map[] [{region In [a b]}]"},
		{in: "!gpu", want: "map[] [{gpu DoesNotExist []}]"},
		{in: "region=", want: "map[region:] []"},
		{in: "region=a b", wantErr: `--selector "region=a b"`},
		{in: "Bad Key=a", wantErr: "--selector"},
		{in: "region=a,", wantErr: "--selector"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			sel, err := parseSelector(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseSelector(%q) = %v, %v; want an error with %q", tc.in, sel, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := describeSelector(sel); got != tc.want {
				t.Errorf("parseSelector(%q) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func describeSelector(s *metav1.LabelSelector) string {
	if s == nil {
		return "<nil>"
	}
	var exprs []string
	for _, e := range s.MatchExpressions {
		exprs = append(exprs, fmt.Sprintf("{%s %s %v}", e.Key, e.Operator, e.Values))
	}
	return fmt.Sprintf("%v [%s]", s.MatchLabels, strings.Join(exprs, " "))
}

// parseOffloadArgs parses as runOffload does, without a cluster.
func parseOffloadArgs(args []string) (string, v1alpha1.NamespaceOffloadSpec, namespaceCommand, string, error) {
	var stderr bytes.Buffer
	nc := newNamespaceCommand("offload", &stderr)
	flags := addOffloadFlags(nc.fs)
	ns, err := nc.parse(args)
	if err != nil {
		return "", v1alpha1.NamespaceOffloadSpec{}, nc, stderr.String(), err
	}
	spec, err := flags.spec()
	return ns, spec, nc, stderr.String(), err
}

func TestOffloadFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    string // ns mapping remote pods selector
		wantErr string // in the error, or what stderr says for a usage error
	}{
		{name: "defaults", args: []string{"namespace", "shop", "--selector", "region=a"}, want: "shop DefaultName - LocalAndRemote map[region:a] []"},
		{name: "no selector", args: []string{"namespace", "shop"}, wantErr: "--selector is required"},
		{name: "all", args: []string{"namespace", "shop", "--selector", "region=a", "--mapping", "Selected", "--remote-name", "store", "--pods", "Remote", "--wait", "5s"},
			want: "shop Selected store Remote map[region:a] []"},
		{name: "same name", args: []string{"namespace", "shop", "--selector", "region=a", "--mapping=SameName", "--pods=Local"}, want: "shop SameName - Local map[region:a] []"},
		{name: "no kind", args: []string{"shop"}, wantErr: "offload namespace NS"},
		{name: "nothing", args: nil, wantErr: "offload namespace NS"},
		{name: "flag first", args: []string{"namespace", "--selector", "a=b"}, wantErr: "offload namespace NS"},
		{name: "bad namespace", args: []string{"namespace", "Shop_1"}, wantErr: `namespace "Shop_1"`},
		{name: "stray argument", args: []string{"namespace", "shop", "extra"}, wantErr: `unexpected argument "extra"`},
		{name: "unknown mapping", args: []string{"namespace", "shop", "--selector", "a=b", "--mapping", "Hashed"}, wantErr: `--mapping "Hashed"`},
		{name: "selected without name", args: []string{"namespace", "shop", "--selector", "a=b", "--mapping", "Selected"}, wantErr: "needs --remote-name"},
		{name: "name without selected", args: []string{"namespace", "shop", "--selector", "a=b", "--remote-name", "store"}, wantErr: "needs --mapping Selected"},
		{name: "remote name not a label", args: []string{"namespace", "shop", "--selector", "a=b", "--mapping", "Selected", "--remote-name", "Store!"}, wantErr: `--remote-name "Store!"`},
		{name: "unknown pods", args: []string{"namespace", "shop", "--selector", "a=b", "--pods", "Everywhere"}, wantErr: `--pods "Everywhere"`},
		{name: "bad selector", args: []string{"namespace", "shop", "--selector", "a b"}, wantErr: `--selector "a b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, spec, _, stderr, err := parseOffloadArgs(tc.args)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("parsed %v, want an error with %q", spec, tc.wantErr)
				}
				if msg := err.Error() + stderr; !strings.Contains(msg, tc.wantErr) {
					t.Errorf("error %q, stderr %q; want %q", err, stderr, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v (stderr %q)", err, stderr)
			}
			remote := spec.RemoteName
			if remote == "" {
				remote = "-"
			}
			got := fmt.Sprintf("%s %s %s %s %s", ns, spec.NamespaceMapping, remote, spec.PodOffloading, describeSelector(spec.ClusterSelector))
			if got != tc.want {
				t.Errorf("parsed %q, want %q", got, tc.want)
			}
		})
	}
}

func TestUnoffloadArgs(t *testing.T) {
	nc := newNamespaceCommand("unoffload", io.Discard)
	if ns, err := nc.parse([]string{"namespace", "shop", "--wait", "0"}); err != nil || ns != "shop" || *nc.wait != 0 {
		t.Errorf("parse: %q, %v, wait %s", ns, err, *nc.wait)
	}
	nc = newNamespaceCommand("unoffload", io.Discard)
	if _, err := nc.parse([]string{"namespace", "shop", "--selector", "a=b"}); !errors.Is(err, errUsage) {
		t.Errorf("unoffload --selector: %v, want a usage error", err)
	}
	nc = newNamespaceCommand("unoffload", io.Discard)
	if _, err := nc.parse([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("unoffload -h: %v, want help", err)
	}
}

// Progress prints a cluster's line only when it changes, and the phase.
func TestOffloadProgress(t *testing.T) {
	var out bytes.Buffer
	p := &progress{w: &out, lines: map[string]string{}}
	at := func(phase v1alpha1.OffloadPhase, reason string) *v1alpha1.NamespaceOffload {
		return &v1alpha1.NamespaceOffload{Status: v1alpha1.NamespaceOffloadStatus{Phase: phase, Clusters: []v1alpha1.ClusterOffload{{
			ClusterID: "cabc", ClusterName: "p1", RemoteNamespace: "shop-abcdef",
			Conditions: []metav1.Condition{{Type: offload.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: "m"}},
		}}}}
	}
	p.show(at(v1alpha1.OffloadInProgress, "Pending"))
	p.show(at(v1alpha1.OffloadInProgress, "Pending"))
	p.show(at(v1alpha1.OffloadSomeFailed, "OverLimit"))
	want := "  p1 (cabc)  shop-abcdef  Pending: m\nphase InProgress\n  p1 (cabc)  shop-abcdef  OverLimit: m\nphase SomeFailed\n"
	if out.String() != want {
		t.Errorf("progress:\n%s\nwant:\n%s", out.String(), want)
	}
	if got := failures(at(v1alpha1.OffloadSomeFailed, "OverLimit")); got != ": p1 (cabc): OverLimit (m)" {
		t.Errorf("failures %q", got)
	}
}

// TestOffloadOutput: offload -o json|yaml|name|wide prints the
// NamespaceOffload as written, progress on stderr.
func TestOffloadOutput(t *testing.T) {
	e := newPeerEnv(t)
	if err := harness.ApplyCRDs(t.Context(), e.cp.Config, deploy.CRDs, "crds/flotilla.io_namespaceoffloads.yaml"); err != nil {
		t.Fatal(err)
	}
	kc := "--kubeconfig=" + e.cp.Kubeconfig
	code, out, errOut := flotilla("offload", "namespace", "default", kc, "--wait=0", "--selector", "region=a", "-o", "json")
	var x v1alpha1.NamespaceOffload
	err := json.Unmarshal([]byte(out), &x)
	if code != 0 || err != nil || x.Kind != "NamespaceOffload" || x.Namespace != "default" || x.Spec.NamespaceMapping != v1alpha1.MappingDefaultName ||
		x.Spec.ClusterSelector == nil || x.ManagedFields != nil || !strings.Contains(errOut, "NamespaceOffload offload created") {
		t.Errorf("offload -o json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	if code, out, _ := flotilla("offload", "namespace", "default", kc, "--wait=0", "--selector", "region=a", "-o", "name"); code != 0 || out != "namespaceoffload.flotilla.io/offload\n" {
		t.Errorf("offload -o name: exit %d\n%s", code, out)
	}
	code, out, _ = flotilla("offload", "namespace", "default", kc, "--wait=0", "--selector", "region in (a,b)", "--pods", "Remote", "-o", "wide")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 ||
		strings.Join(strings.Fields(lines[0]), " ") != "NAMESPACE PHASE MAPPING PODS CLUSTERS REMOTE NAMESPACES SELECTOR" ||
		!strings.Contains(lines[1], "Remote") || !strings.Contains(lines[1], "region in (a,b)") {
		t.Errorf("offload -o wide: exit %d\n%s", code, out)
	}
}
