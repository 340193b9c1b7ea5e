package chaos_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/federation"
)

// remotePod is a pod a consumer made on a provider, by what its origin
// annotation and its namespace's tenant label say.
type remotePod struct {
	on       *federation.Cluster
	ns, name string
	consumer string // the consumer's cluster ID
	origin   string // "<namespace>/<name>/<uid>" of the consumer's pod
}

// remotePods lists the pods of c that carry an origin, in namespaces
// mirrored for a consumer.
func remotePods(c *federation.Cluster) ([]remotePod, error) {
	ctx := context.Background()
	nss, err := c.CP.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: offload.LabelTenant})
	if err != nil {
		return nil, err
	}
	tenant := map[string]string{}
	for _, ns := range nss.Items {
		tenant[ns.Name] = ns.Labels[offload.LabelTenant]
	}
	pods, err := c.CP.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []remotePod
	for _, p := range pods.Items {
		origin, ok := p.Annotations[offload.AnnotationOrigin]
		if !ok {
			continue
		}
		out = append(out, remotePod{on: c, ns: p.Namespace, name: p.Name, consumer: tenant[p.Namespace], origin: origin})
	}
	return out, nil
}

// offloadProblems is what breaks "no offloaded pod duplicated or lost"
// now, one line each: every pair's consumer has the replicas its
// workload asks for, each Running on its provider's virtual node (by the
// provider's current identity); each consumer pod on a virtual node has
// exactly one pod with its origin on that provider and none elsewhere;
// no pod with an origin stands for a consumer pod that is gone, or for a
// consumer identity that no longer exists.
func offloadProblems(cs []*federation.Cluster, ps []*pair, ids map[string]*federation.Cluster) ([]string, error) {
	ctx := context.Background()
	idOf := map[*federation.Cluster]string{}
	for id, c := range ids {
		idOf[c] = id
	}
	// held[consumer][origin] are the pods standing for one consumer pod.
	held := map[*federation.Cluster]map[string][]remotePod{}
	var problems []string
	for _, c := range cs {
		rps, err := remotePods(c)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
		for _, rp := range rps {
			cons, ok := ids[rp.consumer]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: pod %s/%s stands for %s of %q, no current member", c.Name, rp.ns, rp.name, rp.origin, rp.consumer))
				continue
			}
			if held[cons] == nil {
				held[cons] = map[string][]remotePod{}
			}
			held[cons][rp.origin] = append(held[cons][rp.origin], rp)
		}
	}
	for _, c := range cs {
		pods, err := c.CP.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
		p := consumerPair(ps, c)
		live := 0
		for _, pod := range pods.Items {
			origin := pod.Namespace + "/" + pod.Name + "/" + string(pod.UID)
			remote := held[c][origin]
			delete(held[c], origin)
			if !strings.HasPrefix(pod.Spec.NodeName, offload.VirtualNodePrefix) {
				for _, rp := range remote {
					problems = append(problems, fmt.Sprintf("%s: pod %s/%s stands for %s's %s, on no virtual node (%q)", rp.on.Name, rp.ns, rp.name, c.Name, origin, pod.Spec.NodeName))
				}
				continue
			}
			provID := strings.TrimPrefix(pod.Spec.NodeName, offload.VirtualNodePrefix)
			prov := ids[provID]
			var on []string
			for _, rp := range remote {
				on = append(on, rp.on.Name)
			}
			switch {
			case prov == nil:
				problems = append(problems, fmt.Sprintf("%s: pod %s/%s bound to %s, of no current member", c.Name, pod.Namespace, pod.Name, pod.Spec.NodeName))
			case len(remote) != 1 || remote[0].on != prov:
				problems = append(problems, fmt.Sprintf("%s: pod %s/%s on %s's virtual node is on %v, want on %s alone", c.Name, pod.Namespace, pod.Name, prov.Name, on, prov.Name))
			}
			if p != nil && pod.Namespace == offloadNS && pod.DeletionTimestamp == nil {
				live++
				if prov != p.prov || pod.Status.Phase != corev1.PodRunning {
					problems = append(problems, fmt.Sprintf("%s: pod %s/%s %s on %s, want Running on %s's", c.Name, pod.Namespace, pod.Name, pod.Status.Phase, pod.Spec.NodeName, p.prov.Name))
				}
			}
		}
		for origin, remote := range held[c] {
			for _, rp := range remote {
				problems = append(problems, fmt.Sprintf("%s: pod %s/%s stands for %s's %s, which is gone", rp.on.Name, rp.ns, rp.name, c.Name, origin))
			}
		}
		if p != nil && live != int(p.replicas) {
			problems = append(problems, fmt.Sprintf("%s: %d pods of %s/%s offloaded to %s, want %d", c.Name, live, offloadNS, workloadName, p.prov.Name, p.replicas))
		}
	}
	return problems, nil
}

// consumerPair is the pair c is the consumer of, or nil.
func consumerPair(ps []*pair, c *federation.Cluster) *pair {
	if i := slices.IndexFunc(ps, func(p *pair) bool { return p.cons == c }); i >= 0 {
		return ps[i]
	}
	return nil
}

// checkOffload waits up to within for offloadProblems to be none, and
// returns how many are left (each an invariant broken), logging each.
func checkOffload(t *testing.T, cs []*federation.Cluster, ps []*pair, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		problems, err := offloadProblems(cs, ps, currentIDs(t, cs))
		if err == nil && len(problems) == 0 {
			return 0
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Errorf("offloaded pods: %v, %s after the federation converged", err, within)
				return 1
			}
			for _, p := range problems {
				t.Errorf("offloaded pods: %s, %s after the federation converged", p, within)
			}
			return len(problems)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
