package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// gatewayInfo is which replica of the agent runs the data path, from the
// Lease the replicas hold (--leader-elect) and the pod labelled active.
type gatewayInfo struct {
	// Elected: the Lease is there, the replicas elect the active one.
	Elected bool `json:"elected"`
	// Node and Pod are the active replica's, from the Lease's holder and
	// the pod labelled flotilla.io/gateway-role=active.
	Node string `json:"node,omitempty"`
	Pod  string `json:"pod,omitempty"`
	// Since is when the Lease last changed hands, Renewed when its holder
	// last renewed it.
	Since   *metav1.MicroTime `json:"since,omitempty"`
	Renewed *metav1.MicroTime `json:"renewed,omitempty"`
	// Changes is how many times the Lease changed hands.
	Changes int32 `json:"changes"`
}

// readGateway reads the Lease and finds the active pod among pods.
func readGateway(ctx context.Context, kube kubeclient.Interface, ns string, pods []corev1.Pod, info *installInfo, note func(string, error)) {
	g := &info.Agent.Gateway
	for _, p := range pods {
		if p.Labels[ha.RoleLabel] == ha.RoleActive {
			g.Pod, g.Node = p.Name, p.Spec.NodeName
		}
	}
	l, err := kube.CoordinationV1().Leases(ns).Get(ctx, ha.LeaseName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return // one replica, without election
	case err != nil:
		note("the Lease "+ns+"/"+ha.LeaseName, err)
		return
	}
	g.Elected = true
	if h := l.Spec.HolderIdentity; h != nil {
		if node := ha.NodeOfIdentity(*h); node != "" {
			g.Node = node
		}
	}
	g.Since, g.Renewed = l.Spec.AcquireTime, l.Spec.RenewTime
	if l.Spec.LeaseTransitions != nil {
		g.Changes = *l.Spec.LeaseTransitions
	}
}

// describeGateway is the gateway's line of info.
func describeGateway(g gatewayInfo, now time.Time) string {
	if !g.Elected {
		if g.Node == "" {
			return "no agent pod labelled active"
		}
		return fmt.Sprintf("node %s (pod %s), one replica", g.Node, g.Pod)
	}
	if g.Node == "" {
		return "no replica holds the Lease " + ha.LeaseName
	}
	since := "-"
	if g.Since != nil {
		since = fmt.Sprintf("%s (%s)", g.Since.UTC().Format(time.RFC3339), age(timeOf(g.Since), now))
	}
	return fmt.Sprintf("active on node %s (pod %s) since %s, Lease renewed %s, changed hands %d times",
		g.Node, orDash(g.Pod), since, age(timeOf(g.Renewed), now), g.Changes)
}

func timeOf(t *metav1.MicroTime) *metav1.Time {
	if t == nil {
		return nil
	}
	return &metav1.Time{Time: t.Time}
}
