package federation

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/harness"
)

// ours selects what the agent labels as its own (and what deploy/ does).
const ours = v1alpha1.LabelManagedBy + "=" + v1alpha1.ManagedByValue

// uninstallTimeout bounds each step of an uninstall that waits for the
// agents to act.
const uninstallTimeout = 2 * time.Minute

// checkUninstall is OnNodes' teardown, run before the clusters stop:
// every installed agent uninstalled as docs/install.md says, then nothing
// of any agent may be left in any cluster, its own or a peer's (API
// objects labelled as ours, a flotilla.io CRD), nor on any node (our
// links, routes, rules, nftables tables, processes). A test that failed
// already is not checked: what it left says nothing more.
func checkUninstall(t harness.TB, cs []*NodeCluster) {
	t.Helper()
	if t.Failed() {
		return
	}
	var installed []*NodeCluster
	for _, c := range cs {
		if c.Install != "" {
			installed = append(installed, c)
		}
	}
	if len(installed) == 0 {
		return
	}
	// Each step in every cluster at once, the steps in order: a consumer
	// stops offloading before its providers revoke, and a provider's
	// agent deletes its tenants before it is uninstalled.
	step := func(what string, do func(c *NodeCluster) error) {
		t.Helper()
		start := time.Now()
		errs := make([]error, len(installed))
		var wg sync.WaitGroup
		for i, c := range installed {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := do(c); err != nil {
					errs[i] = fmt.Errorf("uninstall %s: %w", c.Name, err)
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("%v", err)
		}
		t.Logf("uninstall: %s in %d clusters: %s", what, len(installed), time.Since(start).Round(time.Millisecond))
	}
	flotilla := harness.Flotilla(t)
	step("unoffload", func(c *NodeCluster) error { return unoffloadAll(c, flotilla) })
	step("revoke", func(c *NodeCluster) error { return revokeAll(c, flotilla) })
	step("delete and clean up", func(c *NodeCluster) error {
		if out, err := KubectlTimeout(c.CP, 3*time.Minute, "delete", "-k", c.Install, "--ignore-not-found", "--wait", "--timeout=150s"); err != nil {
			return fmt.Errorf("kubectl delete -k %s: %v\n%s", c.Install, err, out)
		}
		// As docs/install.md has a user do it: a Job on each gateway
		// candidate still up, with the user's rights, in the agent's
		// image.
		for _, n := range c.Candidates {
			if n.Killed() {
				continue
			}
			out, err := exec.Command(flotilla, "cleanup", "--kubeconfig", c.CP.Kubeconfig, "--node", n.NodeName,
				"--image", c.settings.image, "--wireguard-interface", c.iface, "--wait", "2m").CombinedOutput()
			if err != nil {
				return fmt.Errorf("flotilla cleanup --node %s: %v\n%s", n.NodeName, err, out)
			}
		}
		return nil
	})
	start := time.Now()
	var left []string
	deadline := time.Now().Add(uninstallTimeout)
	for {
		left = nil
		for _, c := range cs {
			for _, l := range LeftBehind(c) {
				left = append(left, c.Name+": "+l)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(3 * time.Second)
	}
	t.Logf("uninstall: nothing left checked in %d clusters: %s", len(cs), time.Since(start).Round(time.Millisecond))
	if len(left) > 0 {
		t.Fatalf("after uninstalling every agent, %d things are left:\n  %s", len(left), strings.Join(left, "\n  "))
	}
}

// unoffloadAll stops offloading every namespace of c (`flotilla unoffload
// namespace NS`) and waits until no NamespaceOffload is left.
func unoffloadAll(c *NodeCluster, flotilla string) error {
	ctx := context.Background()
	var list v1alpha1.NamespaceOffloadList
	err := c.Client.List(ctx, &list)
	if gone(err) {
		return nil // uninstalled by the test already
	}
	if err != nil {
		return fmt.Errorf("NamespaceOffloads: %w", err)
	}
	for _, o := range list.Items {
		if out, err := exec.Command(flotilla, "unoffload", "namespace", o.Namespace, "--kubeconfig", c.CP.Kubeconfig).CombinedOutput(); err != nil {
			return fmt.Errorf("flotilla unoffload namespace %s: %v\n%s", o.Namespace, err, out)
		}
	}
	_, err = eventually.Until(uninstallTimeout, "no NamespaceOffload left", func() error {
		var list v1alpha1.NamespaceOffloadList
		if err := c.Client.List(ctx, &list); err != nil {
			return err
		}
		if n := len(list.Items); n > 0 {
			return fmt.Errorf("%d NamespaceOffloads, the first %s/%s", n, list.Items[0].Namespace, list.Items[0].Name)
		}
		return nil
	})
	return err
}

// revokeAll revokes every grant c gave (`flotilla revoke PEER`) and waits
// until c's agent removed the tenant namespaces: a provider's agent is the
// one that deletes them, so it must do so before it is uninstalled.
func revokeAll(c *NodeCluster, flotilla string) error {
	ctx := context.Background()
	// Every Peer object, not c.Peers: that is by cluster name, which
	// peers may share (BenchmarkAgentMemory's swarm members did: one
	// revoke reached them, 98 tenants stayed).
	var peers v1alpha1.PeerList
	err := c.Client.List(ctx, &peers)
	if gone(err) {
		return nil // uninstalled by the test already
	}
	if err != nil {
		return fmt.Errorf("Peers: %w", err)
	}
	for _, p := range peers.Items {
		if off := p.Status.Offloading; off == nil || off.Granted == nil {
			continue
		}
		if out, err := exec.Command(flotilla, "revoke", p.Name, "--kubeconfig", c.CP.Kubeconfig).CombinedOutput(); err != nil {
			return fmt.Errorf("flotilla revoke %s (%s): %v\n%s", p.Name, p.Status.ClusterName, err, out)
		}
	}
	// The namespace controller deletes them, about ten at a time: after a
	// benchmark that offloaded a hundred namespaces that takes minutes.
	// Waited for as long as their number goes down, uninstallTimeout at
	// most without any going.
	left, progress := -1, time.Now()
	for {
		nss, err := c.CP.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: offload.LabelTenant})
		if err != nil {
			return fmt.Errorf("tenant namespaces: %w", err)
		}
		n := len(nss.Items)
		if n == 0 {
			return nil
		}
		if left < 0 || n < left {
			left, progress = n, time.Now()
		}
		if time.Since(progress) > uninstallTimeout {
			first := nss.Items[0]
			var why []string
			for _, c := range first.Status.Conditions {
				if c.Status == corev1.ConditionTrue {
					why = append(why, fmt.Sprintf("%s: %s", c.Type, c.Message))
				}
			}
			return fmt.Errorf("%d tenant namespaces left, none deleted in %s; the first %s (%s, deleted %v, finalizers %v; %s)", n, uninstallTimeout,
				first.Name, first.Status.Phase, first.DeletionTimestamp != nil, first.Spec.Finalizers, strings.Join(why, "; "))
		}
		time.Sleep(eventually.Poll)
	}
}

// gone says whether err means our kinds are not served: the CRDs were
// deleted, by an uninstall the test made itself.
func gone(err error) bool {
	return err != nil && (meta.IsNoMatchError(err) || apierrors.IsNotFound(err))
}

// LeftBehind lists what of an agent is left in c: API objects labelled
// as ours of any kind, CRDs of flotilla.io, and on each node our WireGuard
// link, routes of our protocol, the fabric's routing table and rules, its
// host source address, nftables tables of ours and flotilla processes
// (on every node but those the test killed).
func LeftBehind(c *NodeCluster) []string {
	out := apiObjectsOf(c)
	for _, n := range append(slices.Clone(c.Candidates), c.Workers...) {
		if n.Killed() {
			continue // what a dead node holds goes with it
		}
		for _, l := range kernelStateOn(n, c.iface) {
			out = append(out, n.NodeName+": "+l)
		}
		for _, p := range processesIn(n) {
			out = append(out, n.NodeName+": "+p)
		}
	}
	return out
}

// apiObjectsOf lists the objects of every listable kind in c labelled as
// ours, and the CRDs of our API groups.
func apiObjectsOf(c *NodeCluster) []string {
	ctx := context.Background()
	cfg := rest.CopyConfig(c.CP.Config)
	cfg.WarningHandler = rest.NoWarnings{} // listing deprecated kinds too
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return []string{"discovery: " + err.Error()}
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return []string{"dynamic client: " + err.Error()}
	}
	lists, err := dc.ServerPreferredResources()
	if err != nil && len(lists) == 0 {
		return []string{"API resources: " + err.Error()}
	}
	var out []string
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		if strings.HasSuffix(gv.Group, "flotilla.io") {
			out = append(out, "API group "+l.GroupVersion+" still served")
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !hasVerb(r.Verbs, "list") {
				continue
			}
			gvr := gv.WithResource(r.Name)
			objs, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{LabelSelector: ours})
			if apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
				continue
			}
			if err != nil {
				out = append(out, fmt.Sprintf("list %s: %v", gvr, err))
				continue
			}
			for _, o := range objs.Items {
				name := o.GetName()
				if ns := o.GetNamespace(); ns != "" {
					name = ns + "/" + name
				}
				out = append(out, fmt.Sprintf("%s %s", gvr.GroupResource(), name))
			}
		}
	}
	return out
}

func hasVerb(verbs []string, v string) bool {
	for _, x := range verbs {
		if x == v {
			return true
		}
	}
	return false
}

// kernelStateOn lists the kernel objects of ours left in n's network: the
// WireGuard link iface, routes of our protocol in any table, the fabric's
// table and rules, its host source address on lo, nftables tables whose
// name starts with flotilla.
func kernelStateOn(n *harness.Node, iface string) []string {
	ctx := context.Background()
	var out []string
	show := func(what string, args ...string) {
		b, err := n.Exec(ctx, args[0], args[1:]...)
		if s := strings.TrimSpace(string(b)); err == nil && s != "" {
			out = append(out, what+": "+s)
		}
	}
	if _, err := n.Exec(ctx, "ip", "link", "show", "dev", iface); err == nil {
		out = append(out, "link "+iface)
	}
	show("routes of protocol "+routeProtocol, "ip", "route", "show", "table", "all", "proto", routeProtocol)
	show("rules of table "+fabricTable, "ip", "rule", "show", "table", fabricTable)
	show("routes in table "+fabricTable, "ip", "route", "show", "table", fabricTable)
	show("address on lo", "ip", "-4", "addr", "show", "dev", "lo", "label", "lo:flotilla")
	if b, err := n.Exec(ctx, "nft", "list", "tables"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 3 && strings.HasPrefix(f[2], "flotilla") {
				out = append(out, "nftables "+line)
			}
		}
	}
	return out
}

// The tunnel's and the fabric's defaults (packages tunnel and fabric).
const (
	routeProtocol = "102"
	fabricTable   = "102"
)

// processesIn lists the flotilla processes (the agent's, the fabric's) in
// n's network namespace.
func processesIn(n *harness.Node) []string {
	var want unix.Stat_t
	if err := unix.Stat(n.Path, &want); err != nil {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) != nil || st.Ino != want.Ino || st.Dev != want.Dev {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if c := strings.TrimSpace(string(comm)); c == "flotilla" {
			out = append(out, fmt.Sprintf("process %s (%s)", e.Name(), c))
		}
	}
	return out
}
