package trace

import (
	"fmt"
	"net/netip"
)

// fabricPods lists the fabric's pod on a node.
func fabricPods(node string) string {
	return fmt.Sprintf("kubectl -n flotilla-system get pods -l app.kubernetes.io/component=fabric -o wide --field-selector spec.nodeName=%s", node)
}

const planCmd = "kubectl -n flotilla-system get configmap flotilla-fabric -o jsonpath='{.data.plan\\.json}'"

// nodeRoute checks a worker node's way to a view: our rule sends every
// lookup to table 102 first, whose route of the view, ours, goes to the
// gateway (directly or through the overlay).
func (t *tracer) nodeRoute(id string, c *Cluster, n *Node, src, dst netip.Addr) {
	where := clusterName(c) + ", node " + n.Name
	if n.Kernel == nil {
		t.add(id, where, "not read: "+c.unread("node/"+n.Name), Unknown, "is the fabric pod there running? "+fabricPods(n.Name))
		return
	}
	d, ok := n.Kernel.lookup(src, dst, "")
	var ourRule *Rule
	for i, r := range n.Kernel.Rules {
		if r.ours() && r.IifName == "" {
			ourRule = &n.Kernel.Rules[i]
		}
	}
	switch {
	case ok && !d.Rule.ours() && d.Rule.Priority < RulePriority:
		t.add(id, where, fmt.Sprintf("rule %q decides before ours (priority %d): %s", d.Rule.String(), RulePriority, d.describe()), Broken,
			"a foreign rule shadows the fabric's: remove it: "+delRule(d.Rule))
	case ok && d.Rule.ours() && d.Route != nil && d.Route.Protocol != OurProtocol:
		t.add(id, where, fmt.Sprintf("table %d sends %s by a foreign route: %s", FabricTable, dst, d.Route), Broken,
			fmt.Sprintf("a foreign route (proto %s) in table %d shadows ours: remove it: %s", protoName(d.Route.Protocol), FabricTable, delRoute(*d.Route)))
	case ourRule == nil:
		t.add(id, where, fmt.Sprintf("the fabric's rule (priority %d, lookup %d) is missing; %s", RulePriority, FabricTable, d.describeOr(ok)), Broken,
			"the fabric pod on the node puts it back at once; is it running? "+fabricPods(n.Name))
	case !ok || !d.Rule.ours():
		t.add(id, where, fmt.Sprintf("table %d has no route to %s; %s", FabricTable, dst, d.describeOr(ok)), Broken,
			"the fabric's plan lacks the view, or the node's fabric pod is behind: "+planCmd+"; "+fabricPods(n.Name))
	case d.Route.Type != "":
		t.add(id, where, d.describe(), Broken, "the fabric never makes a "+d.Route.Type+" route: remove it: "+delRoute(*d.Route))
	default:
		gw := c.gateway()
		if gw != nil && gw.Addr.IsValid() && d.Route.Gw != gw.Addr && (n.Kernel.Overlay == "" || d.Route.Dev != n.Kernel.Overlay) {
			t.add(id, where, fmt.Sprintf("%s, but the gateway is %s (%s)", d.describe(), gw.Name, gw.Addr), Broken,
				"the node's route and the plan disagree: "+planCmd+"; "+fabricPods(n.Name))
			return
		}
		t.add(id, where, d.describe(), OK, "")
	}
}

// exemption checks that the fabric's identity SNAT (the nftables set
// views of table ip flotilla-fabric) holds the view, so the CNI's
// masquerade never rewrites the pod's address.
func (t *tracer) exemption(id string, c *Cluster, n *Node, view netip.Addr) {
	where := clusterName(c) + ", node " + n.Name
	switch {
	case n.Kernel == nil:
		t.add(id, where, "not read", Unknown, "")
	case n.Kernel.Exempt == nil:
		t.add(id, where, "no table ip flotilla-fabric: the CNI's masquerade rewrites the pod's address into the node's, which the peer cannot translate", Broken,
			"the fabric pod on the node makes it; is it running? "+fabricPods(n.Name))
	case !containsAddr(n.Kernel.Exempt, view):
		t.add(id, where, fmt.Sprintf("the set views of table ip flotilla-fabric lacks %s (holds %s): the CNI's masquerade rewrites the source", view, prefixes(n.Kernel.Exempt)), Broken,
			"the fabric pod puts it back at once; "+planCmd+"; "+fabricPods(n.Name))
	default:
		t.add(id, where, fmt.Sprintf("%s is in the set views: the source is kept", view), OK, "")
	}
}

// readGateway returns c's gateway, the step's place and the tunnel's
// link; nil when the gateway's kernel was not read, which it adds to the
// trace as an unknown step.
func (t *tracer) readGateway(id string, c *Cluster) (gw *Node, where, link string) {
	where = clusterName(c) + ", gateway"
	gw = c.gateway()
	if gw == nil || gw.Kernel == nil {
		t.add(id, where, "not read: "+c.unread("agent"), Unknown, "")
		return nil, where, ""
	}
	if c.Tunnel != nil {
		link = c.Tunnel.Interface
	}
	return gw, where, link
}

// gatewayToTunnel checks the gateway's way into the tunnel: the tunnel's
// route of the view in main, through its link with our protocol.
func (t *tracer) gatewayToTunnel(id string, c *Cluster, src, dst netip.Addr) {
	gw, where, link := t.readGateway(id, c)
	if gw == nil {
		return
	}
	isOurs := func(r *Route) bool {
		return r != nil && r.Protocol == OurProtocol && r.Table == MainTable && (link == "" || r.Dev == link) && r.Type == ""
	}
	var ours *Route
	for i := range gw.Kernel.Routes {
		if r := &gw.Kernel.Routes[i]; isOurs(r) && r.Dst.Contains(dst) {
			ours = r
		}
	}
	d, ok := gw.Kernel.lookup(src, dst, "")
	fixTunnel := "the agent puts the tunnel's route back as soon as it sees it go (route events); if it stays missing, read its log: kubectl -n flotilla-system logs deploy/flotilla-agent"
	switch {
	case ok && isOurs(d.Route):
		t.add(id, where, d.describe(), OK, "")
	case ok && d.Rule.Table != MainTable:
		t.add(id, where, fmt.Sprintf("rule %q decides before main: %s", d.Rule.String(), d.describe()), Broken,
			"a foreign rule shadows the tunnel's route: remove it: "+delRule(d.Rule))
	case ok && ours != nil && d.Route != nil:
		t.add(id, where, fmt.Sprintf("%s shadows the tunnel's %s", d.Route, ours.Dst), Broken,
			fmt.Sprintf("a foreign route (proto %s) in table main shadows ours: remove it: %s", protoName(d.Route.Protocol), delRoute(*d.Route)))
	case ours == nil:
		t.add(id, where, fmt.Sprintf("the tunnel has no route to %s in main; %s", dst, d.describeOr(ok)), Broken, fixTunnel)
	default:
		t.add(id, where, d.describeOr(ok), Broken, fixTunnel)
	}
}

// gatewayToNode checks the gateway's way from the tunnel to the node of
// dst: the fabric's rule "iif <link> lookup 102" and its route of the
// node's block; for the gateway's own pods, any route but the tunnel.
func (t *tracer) gatewayToNode(id string, c *Cluster, src, dst netip.Addr, n *Node) {
	gw, where, link := t.readGateway(id, c)
	if gw == nil {
		return
	}
	d, ok := gw.Kernel.lookup(src, dst, link)
	if n == nil {
		switch {
		case !ok || d.Route == nil:
			t.add(id, where, fmt.Sprintf("no route to %s from %s", dst, orNone(link)), Broken,
				"the pod's node is not known and the gateway has no route to it: kubectl get pods -A -o wide")
		case d.Route.Dev == link || d.Route.Type != "":
			t.add(id, where, d.describe(), Broken, "a packet from the tunnel to a pod of this cluster cannot go back into it: remove the route: "+delRoute(*d.Route))
		default:
			t.add(id, where, d.describe()+": the gateway's own pod", OK, "")
		}
		return
	}
	ourRule := func(r Rule) bool {
		return r.ours() && r.IifName == link
	}
	var has bool
	for _, r := range gw.Kernel.Rules {
		has = has || ourRule(r)
	}
	switch {
	case ok && !ourRule(d.Rule) && d.Rule.Priority < RulePriority:
		t.add(id, where, fmt.Sprintf("rule %q decides before ours: %s", d.Rule.String(), d.describe()), Broken,
			"a foreign rule shadows the fabric's: remove it: "+delRule(d.Rule))
	case ok && ourRule(d.Rule) && d.Route.Protocol != OurProtocol:
		t.add(id, where, fmt.Sprintf("table %d sends %s by a foreign route: %s", FabricTable, dst, d.Route), Broken,
			fmt.Sprintf("a foreign route (proto %s) in table %d shadows ours: remove it: %s", protoName(d.Route.Protocol), FabricTable, delRoute(*d.Route)))
	case !has:
		t.add(id, where, fmt.Sprintf("the fabric's rule (priority %d, iif %s lookup %d) is missing; %s", RulePriority, link, FabricTable, d.describeOr(ok)), Broken,
			"the fabric pod on the gateway puts it back at once; is it running? "+fabricPods(gw.Name))
	case !ok || !ourRule(d.Rule):
		t.add(id, where, fmt.Sprintf("table %d has no route to node %s's block; %s", FabricTable, n.Name, d.describeOr(ok)), Broken,
			"the fabric's plan lacks the node: "+planCmd+"; "+fabricPods(gw.Name))
	case d.Route.Gw != n.Addr && (gw.Kernel.Overlay == "" || d.Route.Dev != gw.Kernel.Overlay):
		t.add(id, where, fmt.Sprintf("%s, but the pod is on %s (%s)", d.describe(), n.Name, n.Addr), Broken,
			"the route and the plan disagree: "+planCmd)
	default:
		t.add(id, where, d.describe()+" (node "+n.Name+")", OK, "")
	}
}

func (d Decision) describe() string {
	if d.Route == nil {
		return fmt.Sprintf("rule %q", d.Rule.String())
	}
	return fmt.Sprintf("rule %q, route %s", d.Rule.String(), d.Route)
}

func (d Decision) describeOr(ok bool) string {
	if !ok {
		return "the kernel has no route at all"
	}
	return "the kernel uses " + d.describe()
}
