package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// clustersetZone is the MCS zone (offload/mcs.Zone without its dot),
// named here because the CLI for macOS cannot link offload/mcs, which
// reaches the data path; TestClustersetZone keeps the two equal.
const clustersetZone = "clusterset.local"

func init() { register(newVerifyCommand) }

func newVerifyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "verify",
		GroupID: groupDiagnose,
		Short:   "run real pods on two clusters and check the federation works: --context A --remote-context B",
		Long: `Run real pods on two federated clusters, A (--context) and B
(--remote-context), with your own rights on both, and check what a user
relies on: pod to pod both ways (each dialing the other's pod at its view),
a Service on B, that Service exported (ServiceExport) and reached from A
by its clusterset name, and, when A holds a grant from B, a pod offloaded
from A to B reached from A and its logs read through the virtual node
(kubectl logs). Without a grant those two checks are skipped and say so.

Everything runs in a namespace of its own with a unique name
(verify-flotilla-...), on both clusters, labelled as Flotilla's; it is
deleted at the end, on failure and on Ctrl-C too. The pods run the
agent's image (each cluster's own, or --image) as a non-root user.

Prints a pass/fail table (-o json|yaml: the same as an object) and exits
with status 1 when any check fails. --wait bounds the checks; the
deletion at the end waits up to a minute more.`,
		Args: noArgs,
	}
	var o verifyOptions
	local := clusterFlags(cmd)
	cmd.Flags().StringVar(&o.remote.kubeconfig, "remote-kubeconfig", "", "kubeconfig of cluster B (default: --kubeconfig's)")
	cmd.Flags().StringVar(&o.remote.context, "remote-context", "", "kubeconfig context of cluster B")
	cmd.Flags().StringVar(&o.agentNS, "namespace", agentNamespace, "the agents' namespace on both clusters, where their Deployment names the image")
	cmd.Flags().StringVar(&o.image, "image", "", "the image the pods run: one holding /flotilla of this release or later, which runs `flotilla verify-pod` (default: each cluster's agent image)")
	wait := waitFlag(cmd)
	out := outputFlag(cmd, objectFormats...)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		format, err := parseOutput(*out, objectFormats...)
		if err != nil {
			return err
		}
		if o.remote.kubeconfig == "" && o.remote.context == "" {
			return usageErrorf("say which cluster is B: --remote-context or --remote-kubeconfig")
		}
		if *wait <= 0 {
			return usageErrorf("--wait %s: the checks need time to run; give it more than 0", *wait)
		}
		if o.remote.kubeconfig == "" {
			o.remote.kubeconfig = local.kubeconfig
		}
		o.local, o.wait, o.progress = *local, *wait, cmd.ErrOrStderr()
		r, err := verify(cmd.Context(), o)
		if err != nil {
			return err
		}
		if format == outputTable {
			err = writeVerifyTable(cmd.OutOrStdout(), r)
		} else {
			err = writeJSONOrYAML(cmd.OutOrStdout(), r, format)
		}
		if err != nil {
			return err
		}
		if !r.Passed {
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: %d of %d checks failed\n", cmd.CommandPath(), r.failed(), len(r.Checks))
			return errReported
		}
		return nil
	}
	return cmd
}

type verifyOptions struct {
	local, remote clusterRef
	agentNS       string
	image         string
	wait          time.Duration
	// progress receives a line per step.
	progress io.Writer
}

// The outcomes of a check.
const (
	checkPass    = "pass"
	checkFail    = "fail"
	checkSkipped = "skipped"
)

// verifyCheck is one line of the table.
type verifyCheck struct {
	Name   string `json:"name"`
	From   string `json:"from"`
	To     string `json:"to"`
	Result string `json:"result"`
	Detail string `json:"detail"`
}

// verifyReport is what verify prints.
type verifyReport struct {
	Local     string        `json:"local"`
	Remote    string        `json:"remote"`
	Namespace string        `json:"namespace"`
	Passed    bool          `json:"passed"`
	Seconds   float64       `json:"seconds"`
	Checks    []verifyCheck `json:"checks"`
	// CleanedUp is false when the namespace could not be deleted on
	// every cluster; Notes say where.
	CleanedUp bool     `json:"cleanedUp"`
	Notes     []string `json:"notes,omitempty"`
}

func (r verifyReport) failed() int {
	n := 0
	for _, c := range r.Checks {
		if c.Result == checkFail {
			n++
		}
	}
	return n
}

// The checks, in the table's order.
const (
	checkPodsAB  = "pod to pod"
	checkPodsBA  = "pod to pod (back)"
	checkService = "service"
	checkExport  = "exported service"
	checkOffload = "offloaded pod"
	checkLogs    = "logs via virtual node"
)

// The pods and the Service of a run.
const (
	serverA, serverB, serverOffloaded = "server-a", "server-b", "server-offloaded"
	probeA, probeB, probeOffloaded    = "probe-a", "probe-b", "probe-offloaded"
	exported                          = serverB
)

// verify runs the checks and cleans up. An error is returned only when
// the checks could not start (a cluster unreachable, no right to create
// the namespace); a check that fails is in the report.
func verify(ctx context.Context, o verifyOptions) (r verifyReport, err error) {
	start := time.Now()
	a, err := openVerifySide(ctx, o.local, o.agentNS, o.image)
	if err != nil {
		return verifyReport{}, err
	}
	b, err := openVerifySide(ctx, o.remote, o.agentNS, o.image)
	if err != nil {
		return verifyReport{}, err
	}
	if a.id == b.id {
		return verifyReport{}, fmt.Errorf("%s and %s are the same cluster (%s): give --remote-context another cluster of the federation", a.name, b.name, a.id)
	}
	aPeerB, err := a.peerOf(ctx, b)
	if err != nil {
		return verifyReport{}, err
	}
	bPeerA, err := b.peerOf(ctx, a)
	if err != nil {
		return verifyReport{}, err
	}
	// Each names the other as its agent announced itself.
	if n := bPeerA.Status.ClusterName; n != "" {
		a.name = n
	}
	if n := aPeerB.Status.ClusterName; n != "" {
		b.name = n
	}
	ns := verifyNamePrefix + strings.ToLower(rand.Text()[:8])
	r = verifyReport{Local: a.name, Remote: b.name, Namespace: ns, CleanedUp: true}
	// The deletion runs whatever happened, Ctrl-C included: ctx may be
	// over by then.
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		fmt.Fprintf(o.progress, "deleting namespace %s on %s and %s\n", ns, a.name, b.name)
		for _, s := range []*verifySide{a, b} {
			if err := s.deleteNamespace(cctx, ns); err != nil {
				r.CleanedUp = false
				r.Notes = append(r.Notes, err.Error())
			}
		}
		r.Seconds = time.Since(start).Round(100 * time.Millisecond).Seconds()
	}()

	wctx, cancel := context.WithTimeout(ctx, o.wait)
	defer cancel()
	step := func(format string, args ...any) { fmt.Fprintf(o.progress, format+"\n", args...) }
	step("namespace %s on %s and %s", ns, a.name, b.name)
	for _, s := range []*verifySide{a, b} {
		if err := s.createNamespace(wctx, ns); err != nil {
			return r, err
		}
	}
	run := &verifyRun{o: o, outer: ctx, a: a, b: b, ns: ns, aPeerB: aPeerB, bPeerA: bPeerA, step: step}
	r.Checks = run.checks(wctx)
	r.Passed = r.failed() == 0
	return r, nil
}

// verifyRun is one run's state between its steps.
type verifyRun struct {
	o verifyOptions
	// outer is the run's context without --wait's bound (Ctrl-C ends
	// it): reading the probes' outcome may take a little longer.
	outer          context.Context
	a, b           *verifySide
	ns             string
	aPeerB, bPeerA v1alpha1.Peer
	step           func(format string, args ...any)
	results        map[string]verifyCheck
}

func (v *verifyRun) set(name, from, to, result, detail string) {
	if v.results == nil {
		v.results = map[string]verifyCheck{}
	}
	v.results[name] = verifyCheck{Name: name, From: from, To: to, Result: result, Detail: detail}
}

func (v *verifyRun) failAll(err error, names ...string) {
	for _, n := range names {
		if _, done := v.results[n]; !done {
			c := v.plan(n)
			v.set(n, c.From, c.To, checkFail, err.Error())
		}
	}
}

// plan is where check name goes from and to.
func (v *verifyRun) plan(name string) verifyCheck {
	a, b := v.a.name, v.b.name
	switch name {
	case checkPodsAB:
		return verifyCheck{From: a + " pod", To: b + " pod"}
	case checkPodsBA:
		return verifyCheck{From: b + " pod", To: a + " pod"}
	case checkService:
		return verifyCheck{From: b + " pod", To: b + " Service " + exported}
	case checkExport:
		return verifyCheck{From: a + " pod", To: exported + "." + v.ns + ".svc." + clustersetZone}
	case checkOffload:
		return verifyCheck{From: a + " pod", To: a + " pod offloaded to " + b}
	case checkLogs:
		return verifyCheck{From: a + " API", To: a + " pod offloaded to " + b}
	}
	return verifyCheck{}
}

var checkOrder = []string{checkPodsAB, checkPodsBA, checkService, checkExport, checkOffload, checkLogs}

func (v *verifyRun) checks(ctx context.Context) []verifyCheck {
	v.runChecks(ctx)
	out := make([]verifyCheck, 0, len(checkOrder))
	for _, n := range checkOrder {
		c, ok := v.results[n]
		if !ok {
			p := v.plan(n)
			c = verifyCheck{Name: n, From: p.From, To: p.To, Result: checkFail, Detail: "not run: " + context.Cause(ctx).Error()}
		}
		out = append(out, c)
	}
	return out
}

func (v *verifyRun) runChecks(ctx context.Context) {
	a, b, ns := v.a, v.b, v.ns
	all := checkOrder
	granted, why := grantFrom(v.aPeerB)
	if !granted {
		for _, n := range []string{checkOffload, checkLogs} {
			p := v.plan(n)
			v.set(n, p.From, p.To, checkSkipped, fmt.Sprintf("skipped: no grant from %s (%s)", b.name, why))
		}
	}
	v.step("server pods on %s and %s, Service %s exported from %s", a.name, b.name, exported, b.name)
	for _, f := range []func() error{
		func() error { return a.createServer(ctx, ns, serverA, "") },
		func() error { return b.createServer(ctx, ns, serverB, "") },
		func() error { return b.exportServer(ctx, ns, exported) },
	} {
		if err := f(); err != nil {
			v.failAll(err, all...)
			return
		}
	}
	// The offload runs beside the rest: a provider slow to make its
	// namespace takes no time from the other checks.
	offloaded := make(chan offloadOutcome, 1)
	if granted {
		v.step("offloading %s on %s (a NamespaceOffload to the providers it holds grants of), a pod on %s's virtual node", ns, a.name, b.name)
		go func() { offloaded <- v.offloadPod(ctx) }()
	}
	v.step("waiting for the server pods")
	podA, errA := a.waitPod(ctx, ns, serverA, false)
	podB, errB := b.waitPod(ctx, ns, serverB, false)
	if errA != nil {
		v.failAll(errA, checkPodsAB, checkPodsBA, checkExport)
	}
	if errB != nil {
		v.failAll(errB, checkPodsAB, checkPodsBA, checkService, checkExport)
	}
	var probesA, probesB []probeTarget
	if errA == nil && errB == nil {
		if ip, err := viewOf(v.aPeerB, podB.Status.PodIP); err != nil {
			v.failAll(err, checkPodsAB)
		} else {
			probesA = append(probesA, probeTarget{checkPodsAB, httpURL(ip.String()), serverB})
		}
		if ip, err := viewOf(v.bPeerA, podA.Status.PodIP); err != nil {
			v.failAll(err, checkPodsBA)
		} else {
			probesB = append(probesB, probeTarget{checkPodsBA, httpURL(ip.String()), serverA})
		}
		probesA = append(probesA, probeTarget{checkExport, httpURL(exported + "." + ns + ".svc." + clustersetZone), serverB})
	}
	if errB == nil {
		probesB = append(probesB, probeTarget{checkService, httpURL(exported + "." + ns + ".svc"), serverB})
	}
	v.step("probing: %d check(s) from %s, %d from %s", len(probesA), a.name, len(probesB), b.name)
	startedA, startedB := v.startProbe(ctx, a, probeA, probesA), v.startProbe(ctx, b, probeB, probesB)
	var probesOff []probeTarget
	if granted {
		if o := <-offloaded; o.err != nil {
			v.failAll(o.err, checkOffload, checkLogs)
		} else {
			// The pod's address on A is already A's view of it on B.
			v.step("probing the offloaded pod from %s, reading its logs", a.name)
			probesOff = []probeTarget{{checkOffload, httpURL(o.pod.Status.PodIP), serverOffloaded}}
			v.checkLogs(ctx)
		}
	}
	startedOff := v.startProbe(ctx, a, probeOffloaded, probesOff)
	for _, p := range []struct {
		started bool
		side    *verifySide
		name    string
		targets []probeTarget
	}{{startedA, a, probeA, probesA}, {startedB, b, probeB, probesB}, {startedOff, a, probeOffloaded, probesOff}} {
		if p.started {
			v.collectProbe(ctx, p.side, p.name, p.targets)
		}
	}
}

// offloadOutcome is the offloaded server pod, once Ready, or why not.
type offloadOutcome struct {
	pod corev1.Pod
	err error
}

// offloadPod offloads the run's namespace on A, creates a server pod on
// B's virtual node and waits until it is Ready.
func (v *verifyRun) offloadPod(ctx context.Context) offloadOutcome {
	if err := v.a.offloadTo(ctx, v.ns, v.b.id); err != nil {
		return offloadOutcome{err: err}
	}
	if err := v.a.createServer(ctx, v.ns, serverOffloaded, v.b.id); err != nil {
		return offloadOutcome{err: err}
	}
	p, err := v.a.waitPod(ctx, v.ns, serverOffloaded, false)
	return offloadOutcome{pod: p, err: err}
}

func httpURL(host string) string { return fmt.Sprintf("http://%s:%d/", host, verifyPort) }

// checkLogs reads the offloaded pod's log on A: the API server asks the
// virtual node's kubelet API, which asks the provider.
func (v *verifyRun) checkLogs(ctx context.Context) {
	p := v.plan(checkLogs)
	log, err := v.a.logs(ctx, v.ns, serverOffloaded)
	switch {
	case err != nil:
		v.set(checkLogs, p.From, p.To, checkFail, err.Error())
	case !strings.Contains(log, verifyServingLine):
		v.set(checkLogs, p.From, p.To, checkFail, fmt.Sprintf("the log reads %q, not the server's first line", strings.TrimSpace(log)))
	default:
		v.set(checkLogs, p.From, p.To, checkPass, "kubectl logs: "+strings.TrimSpace(strings.SplitN(log, "\n", 2)[0]))
	}
}

// probeTime is what a probe pod takes besides its probes: starting,
// and its outcome read.
const probeTime = 10 * time.Second

// startProbe starts a pod on s that probes targets for what is left of
// --wait; false: it did not start, and the targets' checks failed.
func (v *verifyRun) startProbe(ctx context.Context, s *verifySide, name string, targets []probeTarget) bool {
	if len(targets) == 0 {
		return false
	}
	deadline, _ := ctx.Deadline()
	within := time.Until(deadline) - probeTime
	if within < 5*time.Second {
		v.failAll(fmt.Errorf("--wait %s ran out before the probes could run", v.o.wait), targetNames(targets)...)
		return false
	}
	if err := s.createProbe(ctx, v.ns, name, within, targets); err != nil {
		v.failAll(err, targetNames(targets)...)
		return false
	}
	return true
}

func targetNames(targets []probeTarget) []string {
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.Name
	}
	return names
}

// collectProbe waits for the probe pod to end and records its outcomes.
func (v *verifyRun) collectProbe(ctx context.Context, s *verifySide, name string, targets []probeTarget) {
	names := targetNames(targets)
	deadline, _ := ctx.Deadline()
	// A pod slow to start still ends its probes by the deadline: allow
	// it a little more than --wait to end and be read.
	octx, cancel := context.WithDeadline(v.outer, deadline.Add(3*probeTime))
	defer cancel()
	if _, err := s.waitPod(octx, v.ns, name, true); err != nil {
		v.failAll(err, names...)
		return
	}
	log, err := s.logs(octx, v.ns, name)
	if err != nil {
		v.failAll(err, names...)
		return
	}
	results, other := parseProbeOutput(log)
	for _, n := range names {
		r, ok := results[n]
		p := v.plan(n)
		switch {
		case !ok:
			v.set(n, p.From, p.To, checkFail, "the probe pod said nothing of it: "+strings.Join(other, "; "))
		case r.OK:
			v.set(n, p.From, p.To, checkPass, r.Detail)
		default:
			v.set(n, p.From, p.To, checkFail, r.Detail)
		}
	}
}

// writeVerifyTable prints the checks, one a line, then the verdict.
func writeVerifyTable(w io.Writer, r verifyReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tFROM\tTO\tRESULT\tDETAIL")
	for _, c := range r.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Name, c.From, c.To, strings.ToUpper(c.Result), c.Detail)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	verdict := "PASSED"
	if !r.Passed {
		verdict = fmt.Sprintf("FAILED (%d of %d checks)", r.failed(), len(r.Checks))
	}
	cleaned := "deleted"
	if !r.CleanedUp {
		cleaned = "NOT deleted everywhere: " + strings.Join(r.Notes, "; ")
	}
	_, err := fmt.Fprintf(w, "\n%s: %s to %s in %.1fs; namespace %s %s\n", verdict, r.Local, r.Remote, r.Seconds, r.Namespace, cleaned)
	return err
}
