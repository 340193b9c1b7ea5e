package peerapi

import (
	"maps"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/tunnel"
)

// statusOf turns a peer state into a Peer status. Conditions keep the
// transition time they have in prev while their status stays the same.
func statusOf(s peering.PeerState, prev []metav1.Condition, now time.Time) v1alpha1.PeerStatus {
	st := v1alpha1.PeerStatus{
		Phase:               v1alpha1.Phase(s.Phase),
		ClusterName:         s.Name,
		AnnouncedLabels:     maps.Clone(s.Labels),
		Sources:             s.Sources,
		Gossip:              s.Gossip,
		StatementGeneration: int64(s.StatementGeneration & (1<<63 - 1)),
		ObservedGeneration:  s.SpecGeneration,
		TheirNetworks:       views(s.TheirNetworks),
		MyNetworks:          views(s.MyNetworks),
	}
	if s.Endpoint.IsValid() {
		st.Endpoint = s.Endpoint.String()
	}
	if s.PublicKey != (tunnel.Key{}) {
		st.PublicKey = s.PublicKey.String()
	}
	var parts []string
	for _, v := range st.TheirNetworks {
		parts = append(parts, v.Range+"=>"+v.As)
	}
	st.Views = strings.Join(parts, ",")
	if !s.LastHandshake.IsZero() {
		t := metav1.NewTime(s.LastHandshake.Truncate(time.Second))
		st.LastHandshake = &t
	}
	for _, c := range []struct {
		kind string
		c    peering.Condition
	}{
		{v1alpha1.ConditionMember, s.Member},
		{v1alpha1.ConditionAccepted, s.Accepted},
		{v1alpha1.ConditionViewsAgreed, s.ViewsAgreed},
		{v1alpha1.ConditionTunnelUp, s.TunnelUp},
		{v1alpha1.ConditionReachable, s.Reachable},
	} {
		if c.c.Reason == "" {
			continue // a state that does not say (one made by hand) writes nothing of it
		}
		cond := metav1.Condition{
			Type: c.kind, Status: metav1.ConditionFalse, Reason: c.c.Reason, Message: c.c.Message,
			ObservedGeneration: s.SpecGeneration, LastTransitionTime: metav1.NewTime(now.Truncate(time.Second)),
		}
		if c.c.OK {
			cond.Status = metav1.ConditionTrue
		}
		if old := meta.FindStatusCondition(prev, c.kind); old != nil && old.Status == cond.Status {
			cond.LastTransitionTime = old.LastTransitionTime
		}
		st.Conditions = append(st.Conditions, cond)
	}
	return st
}

func views(vs []peering.View) []v1alpha1.NetworkView {
	var out []v1alpha1.NetworkView
	for _, v := range vs {
		out = append(out, v1alpha1.NetworkView{Range: v.Range.String(), As: v.As.String()})
	}
	return out
}

var notLabel = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// peerLabels are the labels the agent puts on the Peer of a cluster named
// name: its name and the managed-by label. What the peer announces about
// itself goes to the status (AnnouncedLabels), never to the labels, which
// select providers: only the local admin sets those.
func peerLabels(name string) map[string]string {
	l := map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}
	v := strings.Trim(notLabel.ReplaceAllString(name, "-"), "-._")
	if len(v) > 63 {
		v = strings.Trim(v[:63], "-._")
	}
	if v != "" {
		l[v1alpha1.LabelClusterName] = v
	}
	return l
}
