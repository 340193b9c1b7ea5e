package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
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

// parseOffloadArgs parses "offload ARGS" as the command does, without a
// cluster: the namespace and the spec, or the error the command returns.
func parseOffloadArgs(args []string) (string, v1alpha1.NamespaceOffloadSpec, string, error) {
	var ns string
	var spec v1alpha1.NamespaceOffloadSpec
	cmd := withVerbs(&cobra.Command{Use: "offload"}, newOffloadNamespaceCommand(func(_ *cobra.Command, n string, f *offloadFlags) error {
		ns = n
		var err error
		spec, err = f.spec()
		return err
	}))
	var stderr bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(&stderr)
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err: err} })
	err := cmd.Execute()
	return ns, spec, stderr.String(), err
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
		{name: "no kind", args: []string{"shop"}, wantErr: `unknown verb "shop"`},
		{name: "nothing", args: nil, wantErr: "say what to do"},
		{name: "no namespace", args: []string{"namespace", "--selector", "a=b"}, wantErr: "name the namespace: offload namespace NS"},
		{name: "flags first", args: []string{"namespace", "--selector", "region=a", "--pods", "Remote", "shop"}, want: "shop DefaultName - Remote map[region:a] []"},
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
			ns, spec, stderr, err := parseOffloadArgs(tc.args)
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

// unoffload takes the namespace and --wait, not offload's flags; -h is
// help, as for every command.
func TestUnoffloadArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"unoffload", "namespace", "shop", "--selector", "a=b"}, 2, "unknown flag: --selector"},
		{[]string{"unoffload", "namespace"}, 2, "name the namespace: flotilla unoffload namespace NS"},
		{[]string{"unoffload", "namespace", "-h"}, 0, ""},
		{[]string{"offload", "namespace", "-h"}, 0, ""},
		{[]string{"offload", "-h"}, 0, ""},
	} {
		code, out, errOut := flotilla(tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
		if tc.code == 0 && !strings.Contains(out, "Usage:\n  flotilla "+strings.Join(tc.args[:len(tc.args)-1], " ")) {
			t.Errorf("%q: no usage on stdout:\n%s", tc.args, out)
		}
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
