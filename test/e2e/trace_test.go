package e2e

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-io/flotilla/observe/trace"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// traceWorkerPod runs `flotilla trace` from a's worker pod to b's, with
// both clusters' kubeconfigs, as an operator does (docs/operations.md):
// the whole path is ok, read from the agents and the fabric pods through
// the API servers' pod proxy; then a foreign route in table 102 on a's
// worker, shadowing the fabric's route of b's view, is named as that
// node's route step with the command that removes it. The fabric never
// touches a route it did not make (proto boot), so the break stays until
// the test removes it; then the trace is whole again.
func traceWorkerPod(t *testing.T, cs []*federation.NodeCluster, web map[*federation.NodeCluster]corev1.Pod) {
	a, b := cs[0], cs[1]
	worker := a.Workers[0]
	if web[a].Spec.NodeName != worker.NodeName {
		t.Fatalf("a's web pod is on %s, want the worker %s", web[a].Spec.NodeName, worker.NodeName)
	}
	dst := federation.ViewOf(t, a.Cluster, b.Cluster, netip.MustParseAddr(web[b].Status.PodIP))
	run := func(t *testing.T, dst string) trace.Result {
		t.Helper()
		args := []string{"trace", "default/" + web[a].Name, dst, "--kubeconfig", a.CP.Kubeconfig, "--peer-kubeconfig", b.CP.Kubeconfig, "-o", "json"}
		out, err := exec.Command(harness.Flotilla(t), args...).Output()
		var exit *exec.ExitError
		if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
			t.Fatalf("flotilla %s: %v\n%s%s", strings.Join(args, " "), err, out, stderrOf(err))
		}
		var r trace.Result
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("flotilla %s: %v\n%s%s", strings.Join(args, " "), err, out, stderrOf(err))
		}
		if (r.Broken != "") != (err != nil) {
			t.Errorf("exit status %v with broken step %q", err, r.Broken)
		}
		return r
	}
	whole := func(t *testing.T, r trace.Result) {
		t.Helper()
		if r.Broken != "" {
			t.Fatalf("first broken step %q:\n%s", r.Broken, resultText(r))
		}
		// Every step read, from the worker's route to the delivery back.
		for _, s := range r.Steps {
			if s.Verdict != trace.OK {
				t.Errorf("step %s: %s (%s)", s.ID, s.Verdict, s.Found)
			}
		}
		for _, id := range []string{trace.StepNodeRoute, trace.StepNodeExemption, trace.StepFarDelivery, trace.StepReturnNode, trace.StepReturnDelivery} {
			if s := stepIn(r, id); s == nil {
				t.Errorf("no step %s:\n%s", id, resultText(r))
			}
		}
	}

	t.Run("healthy, by the view and by the pod's name", func(t *testing.T) {
		whole(t, run(t, dst.String()))
		whole(t, run(t, web[b].Name))
	})
	t.Run("a foreign route in table 102 on the worker is named", func(t *testing.T) {
		shadow := netip.PrefixFrom(dst, 24).Masked().String()
		worker.MustExec("ip", "route", "add", "blackhole", shadow, "table", "102", "proto", "boot")
		r := run(t, dst.String())
		worker.MustExec("ip", "route", "del", "blackhole", shadow, "table", "102")
		if r.Broken != trace.StepNodeRoute {
			t.Fatalf("first broken step %q, want %q:\n%s", r.Broken, trace.StepNodeRoute, resultText(r))
		}
		s := stepIn(r, trace.StepNodeRoute)
		if !strings.Contains(s.Where, worker.NodeName) || !strings.Contains(s.Fix, "ip route del "+shadow+" table 102") {
			t.Errorf("step %+v: want node %s and the command that removes %s", s, worker.NodeName, shadow)
		}
		whole(t, run(t, dst.String()))
	})
}

func stepIn(r trace.Result, id string) *trace.Step {
	for i := range r.Steps {
		if r.Steps[i].ID == id {
			return &r.Steps[i]
		}
	}
	return nil
}

func resultText(r trace.Result) string {
	var b strings.Builder
	trace.WriteText(&b, r)
	return b.String()
}

func stderrOf(err error) string {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(exit.Stderr)
	}
	return ""
}
