package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/internal/syncbuf"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The federation key rotates on a running federation of three clusters
// from the command line: the rotation, interrupted after its first step,
// continues when run again; no member leaves any other's membership on
// the way; every agent ends up holding the new key alone, says so by
// fingerprint in its status and metrics, and no key is in a log, a status
// or the metrics. Afterwards a cluster that holds only the old key is
// refused, and the same cluster joins with the new one.
func TestKeyRotateOnARunningFederation(t *testing.T) {
	harness.Require(t, append(harness.NeedsControlPlane, harness.NeedsNetwork...)...)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{
		PodCIDRs: []string{"10.0.0.0/16", "10.0.0.0/16", "10.1.0.0/16", "10.2.0.0/16"},
		ArgsFor: func(i int, cs []*federation.Cluster) []string {
			if i == 3 {
				// d tries the first gateway directly, so that its refusal
				// shows in its join failures.
				return []string{"--join", net.JoinHostPort(cs[0].Site.Addr.String(), strconv.Itoa(discovery.DefaultGossipPort))}
			}
			return nil
		},
	})
	members, d := cs[:3], cs[3]
	federation.Connect(t, members)
	waitKeyStatus(t, members)
	since := memberSince(t, members)

	// The old key, as an operator gets it from `flotilla token`.
	oldTok := d.Args[slices.Index(d.Args, "--federation-key")+1]
	old, err := discovery.ParseFederationKey(oldTok)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	oldFile := filepath.Join(dir, "current")
	if err := os.WriteFile(oldFile, []byte(oldTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"rotate", "--current-key-file", oldFile, "--wait", "90s"}
	for _, c := range members {
		args = append(args, "--kubeconfig", c.CP.Kubeconfig)
	}

	// Leaving a member out is refused, naming it, and changes nothing.
	code, refused, errOut := flotilla("key", "rotate", "--current-key-file", oldFile, "--kubeconfig", members[0].CP.Kubeconfig, "--kubeconfig", members[1].CP.Kubeconfig)
	if code != 1 || !strings.Contains(errOut, "members not given: c (") {
		t.Fatalf("key rotate without c: exit %d\n%s%s", code, refused, errOut)
	}
	if _, err := members[0].CP.Client.CoreV1().Secrets(federation.AgentNamespace).Get(t.Context(), agentapi.FederationSecret, metav1.GetOptions{}); err == nil {
		t.Fatalf("the refused rotation wrote a's Secret")
	}

	stopWatch := watchPartitions(t, members)

	// First run, stopped once the first step is done.
	var out syncbuf.Buffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	go func() { done <- runIn(ctx, append([]string{"key"}, args...), &out, io.Discard) }()
	eventually.Within(t, 2*time.Minute, "the first step done", func() error {
		select {
		case code := <-done:
			t.Fatalf("key rotate returned before its second step: exit %d\n%s", code, out.String())
		default:
		}
		if !strings.Contains(out.String(), "step 2 of 3") {
			return fmt.Errorf("output so far:\n%s", out.String())
		}
		return nil
	})
	cancel()
	<-done
	first := out.String()
	if !strings.Contains(first, "rotating to the new key ") {
		t.Fatalf("the first run does not name the new key:\n%s", first)
	}
	newFP := strings.Fields(first[strings.Index(first, "rotating to the new key ")+len("rotating to the new key "):])[0]

	// The rerun continues with the same key.
	code, second, errOut := flotilla(append([]string{"key"}, args...)...)
	problems := stopWatch()
	if code != 0 {
		t.Fatalf("key rotate again: exit %d\n%s\n%s", code, second, errOut)
	}
	if !strings.Contains(second, "continuing the rotation to key "+newFP) || !strings.Contains(second, "every cluster holds only key "+newFP) {
		t.Fatalf("the rerun did not finish the rotation to %s:\n%s", newFP, second)
	}
	t.Logf("first run:\n%s\nsecond run:\n%s", first, second)
	checkNoPartition(t, members, since, problems)
	federation.AllPairsTalk(t, members)

	// What each agent holds, as the status verb, the status object and
	// the metrics say it.
	next := secretKeyring(t, members[0])
	if len(next) != 1 || discovery.Fingerprint(next[0]) != newFP {
		t.Fatalf("a's Secret asks for %v, want only %s", agentapi.Fingerprints(next), newFP)
	}
	statusArgs := []string{"key", "status"}
	for _, c := range members {
		statusArgs = append(statusArgs, "--kubeconfig", c.CP.Kubeconfig)
	}
	code, status, errOut := flotilla(statusArgs...)
	if code != 0 {
		t.Fatalf("key status: exit %d: %s", code, errOut)
	}
	t.Logf("key status:\n%s", status)
	code, js, errOut := flotilla(append(statusArgs, "-o", "json")...)
	var rows []keyStatusRow
	if err := json.Unmarshal([]byte(js), &rows); code != 0 || err != nil || len(rows) != len(members) {
		t.Fatalf("key status -o json: exit %d, %v: %s%s", code, err, js, errOut)
	}
	for _, r := range rows {
		if !slices.Equal(r.Holds, []string{newFP}) || !slices.Equal(r.SecretAsks, []string{newFP}) || r.Error != "" {
			t.Errorf("key status -o json: %+v, want %s held and asked for alone", r, newFP)
		}
	}
	for _, c := range members {
		if !slices.ContainsFunc(strings.Split(status, "\n"), func(l string) bool {
			return slices.Equal(strings.Fields(l), []string{c.Name, newFP, "(primary)", newFP, "(primary)", "-"})
		}) {
			t.Errorf("key status does not show %s holding and asked for %s alone:\n%s", c.Name, newFP, status)
		}
		metrics := metricsOf(t, c.Site)
		if !strings.Contains(metrics, `flotilla_federation_key_info{fingerprint="`+newFP+`",primary="true"} 1`) ||
			strings.Contains(metrics, discovery.Fingerprint(old.Key)) {
			t.Errorf("%s's metrics do not say it holds %s alone:\n%s", c.Name, newFP, grepLines(metrics, "flotilla_federation_key"))
		}
		cm, err := c.CP.Client.CoreV1().ConfigMaps(federation.AgentNamespace).Get(t.Context(), agentapi.FederationKeysStatus, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		written := fmt.Sprint(cm.Data) + metrics + c.Agent.Log()
		for _, k := range [][]byte{old.Key, next[0]} {
			for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
				if s := enc.EncodeToString(k); strings.Contains(written, s[:len(s)-2]) {
					t.Errorf("%s's status, metrics or log hold the key %s itself", c.Name, discovery.Fingerprint(k))
				}
			}
		}
		if strings.Contains(written, oldTok) {
			t.Errorf("%s's status, metrics or log hold the old join token", c.Name)
		}
	}
	for _, s := range []string{first, second, status} {
		if strings.Contains(s, base64.StdEncoding.EncodeToString(next[0])) || strings.Contains(s, base64.StdEncoding.EncodeToString(old.Key)) {
			t.Errorf("the command printed a key:\n%s", s)
		}
	}

	// An agent restarted with the old key on its command line starts with
	// what its Secret asks for, and is back with the others.
	b := members[1]
	if err := b.Agent.Stop(); err != nil {
		t.Logf("stop b: %v", err)
	}
	b.StartAgent(t)
	federation.WaitPhases(t, members, v1alpha1.PhaseConnected, 90*time.Second)
	if m := metricsOf(t, b.Site); strings.Contains(m, discovery.Fingerprint(old.Key)) {
		t.Errorf("b holds the old key again after a restart:\n%s", grepLines(m, "flotilla_federation_key"))
	}

	// The old key stops working: d, holding only it, tries a's gateway and
	// is refused; nobody becomes a member with it.
	d.StartAgent(t)
	eventually.Within(t, time.Minute, "d's join refused", func() error {
		return metricAtLeast(metricsOf(t, d.Site), "flotilla_discovery_join_failures_total", 1)
	})
	for _, c := range members {
		peers, err := c.Peers(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := peers[d.Name]; ok {
			t.Errorf("%s has a Peer for d, which holds only the old key: %s", c.Name, federation.Describe(p))
		}
	}
	if peers, err := d.Peers(t.Context()); err != nil || len(peers) > 0 {
		t.Errorf("d, holding only the old key, has Peers %v (%v)", peers, err)
	}
	// With the new key the same cluster joins.
	if err := d.Agent.Stop(); err != nil {
		t.Logf("stop d: %v", err)
	}
	newTok, err := discovery.JoinToken{Key: next[0]}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	d.Args = append(d.Args, "--federation-key", newTok)
	d.StartAgent(t)
	federation.WaitPhases(t, cs, v1alpha1.PhaseConnected, 90*time.Second)
}

// watchPartitions looks at every Peer of cs every 50 ms until stopped,
// and returns every sighting of one not Connected or not a member. A
// keyring changed in the wrong order shows within 4 s (measured: a
// cluster moved straight to a key the other lacks).
func watchPartitions(t *testing.T, cs []*federation.Cluster) (stop func() []string) {
	ctx, cancel := context.WithCancel(t.Context())
	var problems []string
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			for _, c := range cs {
				peers, err := c.Peers(ctx)
				if err != nil {
					continue
				}
				for _, p := range peers {
					if m := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionMember); p.Status.Phase != v1alpha1.PhaseConnected || m == nil || m.Status != metav1.ConditionTrue {
						problems = append(problems, fmt.Sprintf("%s sees %s %s", c.Name, p.Status.ClusterName, federation.Describe(p)))
					}
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	return func() []string {
		cancel()
		wg.Wait()
		return problems
	}
}

// checkNoPartition fails t if a Peer was seen cut off, or if a peer's
// membership changed since (between two looks).
func checkNoPartition(t *testing.T, cs []*federation.Cluster, since map[string]time.Time, problems []string) {
	t.Helper()
	if len(problems) > 0 {
		t.Errorf("a member lost another during the rotation:\n  %s", strings.Join(problems[:min(len(problems), 20)], "\n  "))
	}
	if after := memberSince(t, cs); !mapsEqual(since, after) {
		t.Errorf("membership changed during the rotation (Member condition since): before %v, after %v", since, after)
	}
}

// memberSince is, for every Peer of every cluster, since when the peer
// has been a member.
func memberSince(t *testing.T, cs []*federation.Cluster) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	for _, c := range cs {
		peers, err := c.Peers(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for name, p := range peers {
			if m := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionMember); m != nil {
				out[c.Name+"->"+name] = m.LastTransitionTime.Time
			}
		}
	}
	return out
}

func mapsEqual(a, b map[string]time.Time) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !b[k].Equal(v) {
			return false
		}
	}
	return true
}

// secretKeyring is the keyring in c's Secret flotilla-federation.
func secretKeyring(t *testing.T, c *federation.Cluster) [][]byte {
	t.Helper()
	s, err := c.CP.Client.CoreV1().Secrets(federation.AgentNamespace).Get(t.Context(), agentapi.FederationSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ring, err := discovery.DecodeKeyring(s.Data[agentapi.SecretKeyring])
	if err != nil {
		t.Fatal(err)
	}
	return ring
}

// metricsOf reads the metrics of the agent in site s.
func metricsOf(t *testing.T, s *harness.Site) string {
	t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: s.DialContext}}
	resp, err := hc.Get("http://127.0.0.1:9470/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricAtLeast checks that the sum of a metric's series is at least min.
func metricAtLeast(body, name string, min float64) error {
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
	}
	if sum < min {
		return fmt.Errorf("%s is %v, want at least %v", name, sum, min)
	}
	return nil
}

// waitKeyStatus waits until the agent of each of cs has written the
// ConfigMap of its keyring, which the key verbs read: Connected comes
// before an agent has started everything, and its federation keys are
// the last component it starts.
func waitKeyStatus(t testing.TB, cs []*federation.Cluster) {
	t.Helper()
	for _, c := range cs {
		eventually.Within(t, 60*time.Second, c.Name+"'s agent writes "+agentapi.FederationKeysStatus, func() error {
			_, err := c.CP.Client.CoreV1().ConfigMaps(federation.AgentNamespace).Get(context.Background(), agentapi.FederationKeysStatus, metav1.GetOptions{})
			return err
		})
	}
}

func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Where each organisation runs its own steps on its own cluster: a key
// generated by one, handed to the other, installed, used and the old one
// removed by fingerprint, one cluster at a time, without a partition; a
// step out of order is refused and changes nothing.
func TestKeyStepsPerOrganisation(t *testing.T) {
	harness.Require(t, append(harness.NeedsControlPlane, harness.NeedsNetwork...)...)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{PodCIDRs: []string{"10.0.0.0/16", "10.1.0.0/16"}})
	federation.Connect(t, cs)
	since := memberSince(t, cs)
	old, err := discovery.ParseFederationKey(cs[0].Args[slices.Index(cs[0].Args, "--federation-key")+1])
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	code, newKey, _ := flotilla("key", "generate")
	if code != 0 {
		t.Fatalf("key generate: exit %d", code)
	}
	keyFile := filepath.Join(dir, "new")
	if err := os.WriteFile(keyFile, []byte(newKey), 0o600); err != nil {
		t.Fatal(err)
	}
	next, err := discovery.ParseFederationKey(newKey)
	if err != nil {
		t.Fatal(err)
	}
	oldFP, newFP := discovery.Fingerprint(old.Key), discovery.Fingerprint(next.Key)
	// Neither cluster has a Secret yet: the key in use, which only the
	// agents hold, comes from a file (`flotilla token` prints it).
	oldFile := filepath.Join(dir, "old")
	if err := os.WriteFile(oldFile, []byte(base64.StdEncoding.EncodeToString(old.Key)), 0o600); err != nil {
		t.Fatal(err)
	}
	waitKeyStatus(t, cs)
	stop := watchPartitions(t, cs)
	step := func(c *federation.Cluster, args ...string) string {
		t.Helper()
		code, out, errOut := flotilla(append(append([]string{"key"}, args...), "--kubeconfig", c.CP.Kubeconfig)...)
		if code != 0 {
			t.Fatalf("key %v on %s: exit %d\n%s%s", args, c.Name, code, out, errOut)
		}
		return out
	}
	// Without the key in use the verbs cannot write a keyring that keeps
	// it, and say where to get it.
	code, out, errOut := flotilla("key", "install", "--key-file", keyFile, "--kubeconfig", cs[1].CP.Kubeconfig)
	if code != 1 || !strings.Contains(errOut, "pass it with --current-key-file") {
		t.Fatalf("key install without the current key: exit %d\n%s%s", code, out, errOut)
	}
	// Using the new key before installing it is refused.
	code, out, errOut = flotilla("key", "use", "--key-file", keyFile, "--current-key-file", oldFile, "--kubeconfig", cs[1].CP.Kubeconfig)
	if code != 1 || !strings.Contains(errOut, "not installed: install it first") {
		t.Fatalf("key use before install: exit %d\n%s%s", code, out, errOut)
	}
	for _, c := range cs {
		step(c, "install", "--key-file", keyFile, "--current-key-file", oldFile)
	}
	for _, c := range cs {
		step(c, "use", "--key-file", keyFile)
	}
	// Removing the key in use is refused.
	code, out, errOut = flotilla("key", "remove", "--fingerprint", newFP, "--kubeconfig", cs[0].CP.Kubeconfig)
	if code != 1 || !strings.Contains(errOut, "is the primary key") {
		t.Fatalf("key remove of the primary: exit %d\n%s%s", code, out, errOut)
	}
	for _, c := range cs {
		if out := step(c, "remove", "--fingerprint", oldFP); !strings.Contains(out, "holds "+newFP+" (primary)\n") {
			t.Errorf("key remove on %s does not end with the new key alone:\n%s", c.Name, out)
		}
	}
	// A damaged keyring in a Secret: the agent keeps its keys and says
	// why in its status, the verbs refuse to build on it, and nothing is
	// lost meanwhile.
	a := cs[0]
	secrets := a.CP.Client.CoreV1().Secrets(federation.AgentNamespace)
	sec, err := secrets.Get(t.Context(), agentapi.FederationSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	good := sec.Data[agentapi.SecretKeyring]
	sec.Data[agentapi.SecretKeyring] = good[:len(good)-3]
	if sec, err = secrets.Update(t.Context(), sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, time.Minute, "a's status says its keyring is damaged", func() error {
		cm, err := a.CP.Client.CoreV1().ConfigMaps(federation.AgentNamespace).Get(t.Context(), agentapi.FederationKeysStatus, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !strings.Contains(cm.Data[agentapi.StatusError], "truncated") || cm.Data[agentapi.StatusKeys] != newFP {
			return fmt.Errorf("status %v", cm.Data)
		}
		return nil
	})
	code, out, errOut = flotilla("key", "install", "--key-file", oldFile, "--kubeconfig", a.CP.Kubeconfig)
	if code != 1 || !strings.Contains(errOut, "fix or delete that entry") {
		t.Errorf("key install over a damaged keyring: exit %d\n%s%s", code, out, errOut)
	}
	code, status, _ := flotilla("key", "status", "--kubeconfig", a.CP.Kubeconfig)
	if code != 0 || !strings.Contains(status, "damaged keyring") || !strings.Contains(status, "truncated") {
		t.Errorf("key status does not show the damaged keyring:\n%s", status)
	}
	sec.Data[agentapi.SecretKeyring] = good
	if _, err := secrets.Update(t.Context(), sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	checkNoPartition(t, cs, since, stop())
	federation.AllPairsTalk(t, cs)
}

// BenchmarkKeyRotate measures `key rotate` on a running federation of
// two clusters, from the command to every agent holding the new key
// alone: median, min and max of the runs.
func BenchmarkKeyRotate(b *testing.B) {
	harness.Require(b, append(harness.NeedsControlPlane, harness.NeedsNetwork...)...)
	env := harness.New(b)
	cs := federation.New(b, env, federation.Options{PodCIDRs: []string{"10.0.0.0/16", "10.1.0.0/16"}})
	federation.Connect(b, cs)
	waitKeyStatus(b, cs)
	current := filepath.Join(b.TempDir(), "current")
	if err := os.WriteFile(current, []byte(cs[0].Args[slices.Index(cs[0].Args, "--federation-key")+1]), 0o600); err != nil {
		b.Fatal(err)
	}
	args := []string{"key", "rotate", "--current-key-file", current}
	for _, c := range cs {
		args = append(args, "--kubeconfig", c.CP.Kubeconfig)
	}
	var runs []time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if code, out, errOut := flotilla(args...); code != 0 {
			b.Fatalf("key rotate: exit %d\n%s%s", code, out, errOut)
		}
		runs = append(runs, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(runs)
	b.ReportMetric(runs[len(runs)/2].Seconds()*1000, "ms-median")
	b.ReportMetric(runs[0].Seconds()*1000, "ms-min")
	b.ReportMetric(runs[len(runs)-1].Seconds()*1000, "ms-max")
	b.ReportMetric(0, "ns/op") // the median above is the figure
	federation.WaitPhases(b, cs, v1alpha1.PhaseConnected, 30*time.Second)
}
