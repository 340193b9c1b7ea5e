package trace

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Verdict is what a step's state says.
type Verdict string

const (
	// OK: the state there sends the packet on as it should.
	OK Verdict = "ok"
	// Broken: the state is missing or contradicts another step's.
	Broken Verdict = "broken"
	// Unknown: the state was not read (no second cluster given, a pod
	// that did not answer); the trace goes on past it.
	Unknown Verdict = "unknown"
)

// Step IDs, in the order a packet meets them: there, then back.
const (
	StepSource         = "source"
	StepDestination    = "destination"
	StepPeer           = "peer"
	StepNodeRoute      = "node route"
	StepNodeExemption  = "node masquerade exemption"
	StepAgent          = "gateway agent"
	StepGatewayRoute   = "gateway route"
	StepSNAT           = "tunnel SNAT"
	StepWireGuard      = "WireGuard peer"
	StepHandshake      = "handshake"
	StepFarPeer        = "far peer"
	StepFarAgent       = "far gateway agent"
	StepFarWireGuard   = "far WireGuard peer"
	StepFarDNAT        = "far DNAT"
	StepFarDelivery    = "far gateway to node"
	StepFarPolicy      = "far policy"
	StepFarPod         = "destination pod"
	StepReturnNode     = "return node route"
	StepReturnExempt   = "return masquerade exemption"
	StepReturnGateway  = "return gateway route"
	StepReturnDelivery = "return gateway to node"
)

// StaleHandshake is when a handshake is too old: WireGuard's
// REJECT_AFTER_TIME, after which a session carries nothing and a live
// peer has made a new one.
const StaleHandshake = 180 * time.Second

// Step is one place on the packet's way.
type Step struct {
	ID string `json:"id"`
	// Where: which cluster and node.
	Where   string  `json:"where"`
	Found   string  `json:"found"`
	Verdict Verdict `json:"verdict"`
	// Fix says what to do, when the step is broken (or unknown).
	Fix string `json:"fix,omitempty"`
}

// Result is a trace: the two ends as resolved and the steps.
type Result struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	Steps       []Step `json:"steps"`
	// Broken is the ID of the first broken step; empty: none.
	Broken string `json:"broken,omitempty"`
}

// Run traces a packet from src to dst: src in local's terms (a pod's
// name, namespace/name, or an address), dst a pod of remote by name, or
// an address in either cluster's terms (local's view of the remote pod,
// or the pod's real address). remote may be nil: the far side's steps
// are then unknown.
func Run(local, remote *Cluster, src, dst string, now time.Time) Result {
	t := &tracer{a: local, b: remote, now: now}
	t.run(src, dst)
	res := Result{Steps: t.steps}
	if t.src.IsValid() {
		res.Source = t.srcName
	}
	if t.view.IsValid() {
		res.Destination = t.dstName
	}
	for _, s := range t.steps {
		if s.Verdict == Broken {
			res.Broken = s.ID
			break
		}
	}
	return res
}

type tracer struct {
	a, b  *Cluster
	now   time.Time
	steps []Step

	srcName, dstName string
	src              netip.Addr // real, in a's terms
	srcNode          *Node      // nil: the gateway
	peer             *Peer      // a's Peer of b
	view             netip.Addr // the destination in a's terms
	real             netip.Addr // the destination in b's terms (invalid: unknown)
	srcAsSeen        netip.Addr // the source in b's terms, after the SNAT
	farPeer          *Peer      // b's Peer of a
}

func (t *tracer) add(id, where, found string, v Verdict, fix string) {
	t.steps = append(t.steps, Step{ID: id, Where: where, Found: found, Verdict: v, Fix: fix})
}

func (t *tracer) run(src, dst string) {
	if !t.source(src) || !t.destination(dst) {
		return
	}
	t.peerStep()
	if !t.view.IsValid() {
		// The peer holds no views (released or never agreed): the
		// peer step says why, and there is no path past it to read.
		return
	}
	if t.srcNode != nil {
		t.nodeRoute(StepNodeRoute, t.a, t.srcNode, t.src, t.view)
		t.exemption(StepNodeExemption, t.a, t.srcNode, t.view)
	}
	t.agentAnswers(StepAgent, t.a)
	t.gatewayToTunnel(StepGatewayRoute, t.a, t.src, t.view)
	t.snat()
	wg := t.wireGuard()
	t.handshake(wg)
	t.farSide()
	t.gatewayToNode(StepReturnDelivery, t.a, t.view, t.src, t.srcNode)
}

// source resolves src in a: a pod by name or address, or an address.
func (t *tracer) source(src string) bool {
	where := clusterName(t.a)
	pod, addr, err := findPod(t.a, src)
	if err != nil {
		t.add(StepSource, where, err.Error(), Broken, fmt.Sprintf("kubectl get pods -A -o wide | grep %s", src))
		return false
	}
	t.src, t.srcName = addr, addr.String()
	found := addr.String()
	if pod != nil {
		t.srcName = pod.Namespace + "/" + pod.Name + " (" + addr.String() + ")"
		found = fmt.Sprintf("pod %s/%s, %s", pod.Namespace, pod.Name, addr)
	}
	t.srcNode = t.a.nodeOf(pod, addr)
	if t.srcNode != nil {
		found += ", on worker node " + t.srcNode.Name
	} else {
		found += ", on the gateway"
	}
	t.add(StepSource, where, found, OK, "")
	return true
}

// destination resolves dst into the peer and the address in both
// clusters' terms.
func (t *tracer) destination(dst string) bool {
	where := clusterName(t.a)
	fail := func(found, fix string) bool {
		t.add(StepDestination, where, found, Broken, fix)
		return false
	}
	addr, err := netip.ParseAddr(dst)
	if err != nil {
		if t.b == nil {
			return fail(fmt.Sprintf("%q is not an address, and a pod name needs the peer cluster", dst),
				"give the peer cluster's context (--peer-context) or the pod's address")
		}
		pod, a, err := findPod(t.b, dst)
		if err != nil {
			return fail(err.Error(), fmt.Sprintf("kubectl --context <peer> get pods -A -o wide | grep %s", dst))
		}
		t.real = a
		t.dstName = fmt.Sprintf("%s/%s (%s)", pod.Namespace, pod.Name, a)
		p := t.a.peer(t.b.ID, t.b.Name)
		if p == nil {
			return fail(fmt.Sprintf("%s has no Peer for %s", clusterName(t.a), clusterName(t.b)),
				"kubectl get peers: the two clusters have not found each other (docs/operations.md)")
		}
		t.peer = p
		v, ok := translate(a, p.Theirs, false)
		if !ok {
			return fail(fmt.Sprintf("%s is in no network of %s that %s addresses (%s)", a, p.label(), clusterName(t.a), views(p.Theirs)),
				fmt.Sprintf("kubectl get peer %s -o yaml: its status.theirNetworks lack the pod's network", p.ID))
		}
		t.view = v
		t.dstName = fmt.Sprintf("%s/%s (%s, %s in %s's terms)", pod.Namespace, pod.Name, a, v, strings.TrimPrefix(clusterName(t.a), "cluster "))
	} else if p, real := t.a.peerByView(addr); p != nil {
		t.peer, t.view, t.real = p, addr, real
		t.dstName = addr.String()
	} else if p, view := t.a.peerByReal(addr, t.b); p != nil && (!t.a.local(addr) || t.b != nil && t.b.podAt(addr) != nil) {
		// Overlapping clusters number alike: a real address of the peer
		// that is also one of ours counts as the peer's only when the
		// peer cluster has a pod there.
		t.peer, t.view, t.real = p, view, addr
		t.dstName = fmt.Sprintf("%s (%s in %s's terms)", view, addr, p.label())
	} else {
		if t.a.local(addr) {
			return fail(fmt.Sprintf("%s is an address of %s itself", addr, clusterName(t.a)),
				"trace goes to a pod of a peer: give its address as this cluster addresses it (kubectl get peers -o wide shows the views)")
		}
		if t.viewless() {
			t.add(StepDestination, where, fmt.Sprintf("%s is in no view: %s holds none of %s (released or not agreed)", addr, clusterName(t.a), t.peer.label()), Unknown, "")
			return true
		}
		found := fmt.Sprintf("%s is in no view of any peer of %s", addr, clusterName(t.a))
		var viewless []string
		for _, p := range t.a.Peers {
			if len(p.Theirs) == 0 {
				viewless = append(viewless, fmt.Sprintf("%s (%s)", p.label(), orNone(p.Phase)))
			}
		}
		if len(viewless) > 0 {
			found += "; peers without views (not agreed, or released): " + strings.Join(viewless, ", ")
		}
		return fail(found, "kubectl get peers -o wide shows how this cluster addresses each peer's networks")
	}
	if t.b != nil && !t.peer.is(t.b.ID, t.b.Name) {
		return fail(fmt.Sprintf("%s is in %s, but the peer cluster given is %s", t.view, t.peer.label(), clusterName(t.b)),
			"give the context of the cluster that holds the destination")
	}
	if t.dstName == t.view.String() && t.real.IsValid() {
		t.dstName = fmt.Sprintf("%s (%s in %s's terms)", t.view, t.real, t.peer.label())
	}
	found := fmt.Sprintf("%s in %s", t.view, t.peer.label())
	if t.real.IsValid() {
		found += fmt.Sprintf(", real address %s there", t.real)
	}
	t.add(StepDestination, where, found, OK, "")
	return true
}

// viewless reports whether an address in no view may be the peer
// cluster's all the same: the peer cluster is given, and a's Peer of it
// holds no views and is denied here or not Connected (its views released
// by the deny, or while it is unreachable). It sets t.peer, so that the
// peer step names why.
func (t *tracer) viewless() bool {
	if t.b == nil {
		return false
	}
	p := t.a.peer(t.b.ID, t.b.Name)
	if p == nil || len(p.Theirs) > 0 || p.Phase == "Connected" && p.Networking != "Deny" {
		return false
	}
	t.peer = p
	return true
}

func (t *tracer) peerStep() {
	p := t.peer
	where := clusterName(t.a) + ", Peer " + p.ID
	found := fmt.Sprintf("phase %s", orNone(p.Phase))
	if p.Networking != "" {
		found += ", networking " + p.Networking
	}
	if p.Reason != "" {
		found += fmt.Sprintf(" (%s: %s)", p.Reason, p.Message)
	}
	switch {
	case p.Networking == "Deny":
		t.add(StepPeer, where, found, Broken, "this cluster denies networking with the peer: flotilla peer accept "+p.ID)
	case p.Phase == "Denied":
		t.add(StepPeer, where, found, Broken, fmt.Sprintf("%s denies networking with this cluster: there, flotilla peer accept %s", p.label(), orNone(t.a.ID)))
	case p.Phase == "Unreachable" || p.Phase == "Degraded":
		t.add(StepPeer, where, found, Broken, fmt.Sprintf("%s does not answer: is its agent running? kubectl --context <peer> -n flotilla-system get pods -l app.kubernetes.io/component=agent; kubectl get peer %s -o yaml", p.label(), p.ID))
	case p.Phase != "Connected":
		t.add(StepPeer, where, found, Broken, fmt.Sprintf("the peering is not up: kubectl get peer %s -o yaml (conditions say what it waits for)", p.ID))
	default:
		t.add(StepPeer, where, found, OK, "")
	}
}

// snat checks the gateway's egress NAT for the peer: the egress map
// sends the view to the peer's chain, whose SNAT gives the source the
// peer's view of it, the one the Peer says.
func (t *tracer) snat() {
	where := clusterName(t.a) + ", gateway"
	if t.a.Tunnel == nil {
		t.add(StepSNAT, where, "the tunnel was not read: "+t.a.unread("agent"), Unknown, "")
		return
	}
	n := t.a.Tunnel.nat(t.peer.ID)
	fixNAT := "the agent puts its NAT back as soon as it sees the change (nftables events); if it stays so, read its log: kubectl -n flotilla-system logs deploy/flotilla-agent"
	if n == nil || !containsAddr(n.EgressViews, t.view) {
		t.add(StepSNAT, where, fmt.Sprintf("the egress map of table ip flotilla sends no traffic to %s to the chain of %s", t.view, t.peer.ID), Broken, fixNAT)
		return
	}
	want, wantOK := translate(t.src, t.peer.Mine, false)
	got, ok := translateT(t.src, n.SNAT)
	if ok {
		// The far side gets what the kernel makes, right or wrong.
		t.srcAsSeen = got
	}
	switch {
	case !ok && !wantOK:
		t.add(StepSNAT, where, fmt.Sprintf("%s is in no network of %s that %s sees (%s)", t.src, clusterName(t.a), t.peer.label(), views(t.peer.Mine)), Broken,
			"only pods (and the host source) reach peers; kubectl get peer "+t.peer.ID+" -o yaml shows status.myNetworks")
	case !ok:
		t.add(StepSNAT, where, fmt.Sprintf("chain egress-%s has no SNAT for %s (the Peer says %s sees it as %s)", t.peer.ID, t.src, t.peer.label(), want), Broken, fixNAT)
	case wantOK && got != want:
		t.add(StepSNAT, where, fmt.Sprintf("the kernel's SNAT turns %s into %s but the Peer says %s sees it as %s", t.src, got, t.peer.label(), want), Broken, fixNAT)
	default:
		t.add(StepSNAT, where, fmt.Sprintf("source %s leaves as %s (%s's view of it)", t.src, got, t.peer.label()), OK, "")
	}
}

// wireGuard checks that one WireGuard peer allows the view, and that it
// is the peer's key.
func (t *tracer) wireGuard() *WGPeer {
	where := clusterName(t.a) + ", gateway"
	if t.a.Tunnel == nil {
		t.add(StepWireGuard, where, "the tunnel was not read: "+t.a.unread("agent"), Unknown, "")
		return nil
	}
	w := t.a.Tunnel.allowing(t.view)
	if w == nil {
		t.add(StepWireGuard, where, fmt.Sprintf("no WireGuard peer on %s allows %s", t.a.Tunnel.Interface, t.view), Broken,
			fmt.Sprintf("the agent puts the peer back at its next resync (every 30 s); if it stays missing: kubectl get peer %s -o yaml, and the agent's log", t.peer.ID))
		return nil
	}
	found := fmt.Sprintf("peer %s (endpoint %s) allows %s", short(w.PublicKey), orNone(w.Endpoint), prefixes(w.AllowedIPs))
	if t.peer.PublicKey != "" && w.PublicKey != t.peer.PublicKey {
		t.add(StepWireGuard, where, found+fmt.Sprintf(", but Peer %s's key is %s", t.peer.ID, short(t.peer.PublicKey)), Broken,
			"the device and the Peer disagree on the key: the agent resyncs within 30 s; if not, restart it: kubectl -n flotilla-system rollout restart deploy/flotilla-agent")
		return w
	}
	t.add(StepWireGuard, where, found, OK, "")
	return w
}

func (t *tracer) handshake(w *WGPeer) {
	where := clusterName(t.a) + ", gateway"
	if w == nil {
		t.add(StepHandshake, where, "no WireGuard peer to ask", Unknown, "")
		return
	}
	fix := fmt.Sprintf("%s's gateway does not answer at %s: is its agent running (kubectl --context <peer> -n flotilla-system get pods), and does UDP reach that endpoint?", t.peer.label(), orNone(w.Endpoint))
	switch {
	case w.LastHandshake.IsZero():
		t.add(StepHandshake, where, "never", Broken, fix)
	case t.now.Sub(w.LastHandshake) > StaleHandshake:
		t.add(StepHandshake, where, fmt.Sprintf("%s ago, older than %s: the session is dead", age(t.now.Sub(w.LastHandshake)), StaleHandshake), Broken, fix)
	default:
		t.add(StepHandshake, where, age(t.now.Sub(w.LastHandshake))+" ago", OK, "")
	}
}

// farSide follows the packet in b, and its answer back to a's tunnel.
func (t *tracer) farSide() {
	if t.b == nil {
		t.add(StepFarPeer, t.peer.label(), "not read", Unknown,
			"give the peer cluster's kubeconfig context (--peer-context) to follow the packet there")
		return
	}
	where := clusterName(t.b)
	t.farPeer = t.b.peer(t.a.ID, t.a.Name)
	switch p := t.farPeer; {
	case p == nil:
		t.add(StepFarPeer, where, fmt.Sprintf("no Peer for %s", clusterName(t.a)), Broken, "kubectl get peers there: it has not found this cluster")
		return
	case p.Networking == "Deny":
		t.add(StepFarPeer, where+", Peer "+p.ID, "networking Deny", Broken, "there: flotilla peer accept "+p.ID)
	case p.Phase == "Denied":
		t.add(StepFarPeer, where+", Peer "+p.ID, "phase Denied", Broken, "this cluster denies it: flotilla peer accept "+t.peer.ID)
	case p.Phase != "Connected":
		t.add(StepFarPeer, where+", Peer "+p.ID, fmt.Sprintf("phase %s (%s: %s)", orNone(p.Phase), p.Reason, p.Message), Broken,
			fmt.Sprintf("there: kubectl get peer %s -o yaml", p.ID))
	default:
		t.add(StepFarPeer, where+", Peer "+p.ID, "phase Connected", OK, "")
	}
	if !t.srcAsSeen.IsValid() {
		if v, ok := translate(t.src, t.peer.Mine, false); ok {
			t.srcAsSeen = v
		} else {
			return
		}
	}
	t.agentAnswers(StepFarAgent, t.b)
	t.farWireGuard()
	t.farDNAT()
	if !t.real.IsValid() {
		return
	}
	dstNode := t.b.nodeOf(t.b.podAt(t.real), t.real)
	t.gatewayToNode(StepFarDelivery, t.b, t.srcAsSeen, t.real, dstNode)
	t.farPolicy()
	t.farPod(dstNode)
	if dstNode != nil {
		t.nodeRoute(StepReturnNode, t.b, dstNode, t.real, t.srcAsSeen)
		t.exemption(StepReturnExempt, t.b, dstNode, t.srcAsSeen)
	}
	t.gatewayToTunnel(StepReturnGateway, t.b, t.real, t.srcAsSeen)
}

// agentAnswers names a gateway whose agent could not be read: with the
// agent down (or its tunnel closed) nothing crosses that gateway.
func (t *tracer) agentAnswers(id string, c *Cluster) {
	why, unread := c.Unread["agent"]
	if c.Tunnel != nil || !unread {
		return
	}
	t.add(id, clusterName(c)+", gateway", "its agent does not answer: "+why, Broken,
		"is the agent running? kubectl -n flotilla-system get pods -l app.kubernetes.io/component=agent (with --peer-context for the peer's); its log says why it stopped")
}

func (t *tracer) farWireGuard() {
	where := clusterName(t.b) + ", gateway"
	if t.b.Tunnel == nil {
		t.add(StepFarWireGuard, where, "the tunnel was not read: "+t.b.unread("agent"), Unknown, "")
		return
	}
	w := t.b.Tunnel.allowing(t.srcAsSeen)
	switch {
	case w == nil:
		t.add(StepFarWireGuard, where, fmt.Sprintf("no WireGuard peer on %s allows the source %s: the packet is dropped on arrival", t.b.Tunnel.Interface, t.srcAsSeen), Broken,
			"its agent puts the peer back at its next resync (every 30 s); there: kubectl get peer "+t.farPeerID()+" -o yaml")
	case t.farPeer != nil && t.farPeer.PublicKey != "" && w.PublicKey != t.farPeer.PublicKey:
		t.add(StepFarWireGuard, where, fmt.Sprintf("peer %s allows %s, but Peer %s's key is %s", short(w.PublicKey), t.srcAsSeen, t.farPeerID(), short(t.farPeer.PublicKey)), Broken,
			"there, the device and the Peer disagree on the key: its agent resyncs within 30 s")
	default:
		t.add(StepFarWireGuard, where, fmt.Sprintf("peer %s allows the source %s", short(w.PublicKey), t.srcAsSeen), OK, "")
	}
}

func (t *tracer) farDNAT() {
	where := clusterName(t.b) + ", gateway"
	if t.b.Tunnel == nil {
		t.add(StepFarDNAT, where, "the tunnel was not read: "+t.b.unread("agent"), Unknown, "")
		return
	}
	fix := "its agent puts its NAT back as soon as it sees the change; if it stays so, read its log there: kubectl -n flotilla-system logs deploy/flotilla-agent"
	n := t.b.Tunnel.nat(t.a.ID)
	if n == nil || !containsAddr(n.IngressViews, t.srcAsSeen) {
		t.add(StepFarDNAT, where, fmt.Sprintf("the ingress map of table ip flotilla sends no traffic from %s to the chain of %s", t.srcAsSeen, orNone(t.a.ID)), Broken, fix)
		return
	}
	got, ok := translateT(t.view, n.DNAT)
	if !ok {
		// A network the peer sees as it is has no DNAT: the address stays.
		got = t.view
	}
	if t.real.IsValid() && got != t.real {
		t.add(StepFarDNAT, where, fmt.Sprintf("%s is delivered to %s, but %s's view says %s", t.view, got, clusterName(t.a), t.real), Broken,
			"the two sides disagree on the view: kubectl get peer on both sides; the views renegotiate when a side restarts")
		return
	}
	t.real = got
	t.add(StepFarDNAT, where, fmt.Sprintf("destination %s becomes %s", t.view, got), OK, "")
}

func (t *tracer) farPolicy() {
	where := clusterName(t.b) + ", gateway"
	if t.farPeer == nil || t.farPeer.Traffic != "Segregated" {
		t.add(StepFarPolicy, where, "traffic from "+clusterName(t.a)+" is Full: it reaches every pod", OK, "")
		return
	}
	if t.b.Tunnel == nil {
		t.add(StepFarPolicy, where, "Segregated; the filter was not read", Unknown, "")
		return
	}
	for _, p := range t.b.Tunnel.Policy {
		if p.Peer != t.a.ID {
			continue
		}
		if slices.Contains(p.Pods, t.real) {
			t.add(StepFarPolicy, where, fmt.Sprintf("Segregated; %s is a pod of %s offloaded there", t.real, clusterName(t.a)), OK, "")
			return
		}
		var ports []string
		for _, e := range p.Services {
			if e.Addr == t.real {
				ports = append(ports, fmt.Sprintf("%s/%d", e.Protocol, e.Port))
			}
		}
		if len(ports) > 0 {
			t.add(StepFarPolicy, where, fmt.Sprintf("Segregated; %s may be reached on %s only", t.real, strings.Join(ports, ", ")), OK, "")
			return
		}
	}
	t.add(StepFarPolicy, where, fmt.Sprintf("Segregated, and %s is neither a pod of %s offloaded there nor the endpoint of a Service exported to it: dropped", t.real, clusterName(t.a)), Broken,
		fmt.Sprintf("there: export or reflect a Service selecting the pod, or kubectl patch peer %s --type merge -p '{\"spec\":{\"traffic\":\"Full\"}}' (docs/policy.md)", t.farPeerID()))
}

func (t *tracer) farPod(node *Node) {
	where := clusterName(t.b)
	pod := t.b.podAt(t.real)
	switch {
	case pod != nil:
		on := "the gateway"
		if node != nil {
			on = "node " + node.Name
		}
		t.add(StepFarPod, where, fmt.Sprintf("pod %s/%s on %s", pod.Namespace, pod.Name, on), OK, "")
	case len(t.b.Pods) > 0:
		t.add(StepFarPod, where, fmt.Sprintf("no pod has the address %s", t.real), Broken,
			"the pod is gone or was given another address: kubectl --context <peer> get pods -A -o wide")
	default:
		t.add(StepFarPod, where, t.real.String()+" (its pods were not read)", Unknown, "")
	}
}

func (t *tracer) farPeerID() string {
	if t.farPeer != nil {
		return t.farPeer.ID
	}
	return orNone(t.a.ID)
}

func clusterName(c *Cluster) string {
	switch {
	case c == nil:
		return "the peer"
	case c.Name != "":
		return "cluster " + c.Name
	case c.ID != "":
		return "cluster " + c.ID
	}
	return "this cluster"
}

func (p *Peer) label() string {
	if p.Name != "" {
		return p.Name
	}
	return p.ID
}

func (p *Peer) is(id, name string) bool {
	return id != "" && p.ID == id || id == "" && name != "" && p.Name == name
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func short(key string) string {
	if len(key) > 8 {
		return key[:8] + "…"
	}
	return key
}

func age(d time.Duration) string {
	return d.Round(time.Second).String()
}
