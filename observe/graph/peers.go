package graph

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// PeerOf is what a cluster's Peer says of the other cluster.
func PeerOf(p *v1alpha1.Peer) PeerReport {
	s := p.Status
	v := View{
		Phase:      string(s.Phase),
		Endpoint:   s.Endpoint,
		Theirs:     networks(s.TheirNetworks),
		Mine:       networks(s.MyNetworks),
		Networking: string(p.Spec.Networking),
		Offloading: string(p.Spec.Offloading),
		Traffic:    string(p.Spec.Traffic),
	}
	v.LastHandshake = timeOf(s.LastHandshake)
	if o := s.Offloading; o != nil {
		v.Hosts = grantOf(o.Granted, s.Conditions, v1alpha1.ConditionOffloadGranted)
		v.OffloadsTo = grantOf(o.Received, s.Conditions, v1alpha1.ConditionOffloadCredential)
	}
	return PeerReport{ID: p.Name, Name: s.ClusterName, View: v}
}

// PeersOf is PeerOf of each Peer.
func PeersOf(peers []v1alpha1.Peer) []PeerReport {
	out := make([]PeerReport, 0, len(peers))
	for i := range peers {
		out = append(out, PeerOf(&peers[i]))
	}
	return out
}

// OffloadsOf are the namespaces a cluster's NamespaceOffloads extend.
func OffloadsOf(nos []v1alpha1.NamespaceOffload) []Offload {
	out := make([]Offload, 0, len(nos))
	for _, no := range nos {
		o := Offload{Namespace: no.Namespace, Phase: string(no.Status.Phase)}
		for _, c := range no.Status.Clusters {
			p := Placement{ClusterID: c.ClusterID, RemoteNamespace: c.RemoteNamespace}
			if cond := meta.FindStatusCondition(c.Conditions, "Ready"); cond != nil {
				p.Ready = string(cond.Status)
			}
			o.Providers = append(o.Providers, p)
		}
		out = append(out, o)
	}
	return out
}

func grantOf(g *v1alpha1.GrantStatus, conds []metav1.Condition, kind string) *Grant {
	if g == nil {
		return nil
	}
	out := &Grant{Namespace: g.Namespace, Expires: timeOf(g.Expires)}
	if c := meta.FindStatusCondition(conds, kind); c != nil {
		out.State = c.Reason
	}
	return out
}

func networks(vs []v1alpha1.NetworkView) []NetworkView {
	var out []NetworkView
	for _, v := range vs {
		out = append(out, NetworkView{Range: v.Range, As: v.As})
	}
	return out
}

func timeOf(t *metav1.Time) *time.Time {
	if t == nil || t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
