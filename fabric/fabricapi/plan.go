// Package fabricapi is the Kubernetes side of the fabric. The agent
// publishes the cluster's fabric plan (which node is the gateway, the views
// of every peer, every node's pod blocks) in a ConfigMap and owns the
// DaemonSet that runs `flotilla fabric` on every node; each fabric pod
// reads the plan and applies its own node's part with package fabric.
package fabricapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/ipam"
)

// Names of what the agent creates in its namespace.
const (
	// PlanName is the ConfigMap holding the plan, under PlanKey.
	PlanName = "flotilla-fabric"
	PlanKey  = "plan.json"
	// DaemonSetName and ServiceAccountName: the fabric's pods and their
	// identity (deploy/ installs the account and its Role).
	DaemonSetName      = "flotilla-fabric"
	ServiceAccountName = "flotilla-fabric"
)

// Plan is the fabric of the whole cluster, as the agent publishes it.
type Plan struct {
	// GatewayNode is the Node the agent runs on; Gateway is its address
	// on the node network, which every other node routes the views to.
	GatewayNode string     `json:"gatewayNode"`
	Gateway     netip.Addr `json:"gateway"`
	// TunnelInterface is the gateway's WireGuard link; MTU its MTU.
	TunnelInterface string `json:"tunnelInterface"`
	MTU             int    `json:"mtu"`
	// Views are the ranges this cluster addresses its peers' networks by.
	Views []netip.Prefix `json:"views"`
	// Nodes are the cluster's nodes with their addresses and pod blocks.
	Nodes []Node `json:"nodes"`
	// GatewayLease, when set, names the Lease (in the plan's namespace)
	// the agent's replicas elect the active one by: the gateway is the
	// node of the replica holding it, from the moment it holds it
	// (WithGatewayOf), so every node's routes move with the Lease rather
	// than after the new active replica publishes its plan.
	GatewayLease string `json:"gatewayLease,omitempty"`
}

// WithGatewayOf is the plan with the gateway moved to the node of the
// replica whose identity holder is (ha.NewIdentity), when the plan
// follows a Lease, holder names one of its nodes and that node has an
// IPv4 address; otherwise the plan as it is, and false.
func (p Plan) WithGatewayOf(holder string) (Plan, bool) {
	node := ha.NodeOfIdentity(holder)
	if p.GatewayLease == "" || node == "" || node == p.GatewayNode {
		return p, false
	}
	for _, n := range p.Nodes {
		if n.Name == node && n.Addr.IsValid() && n.Addr.Is4() {
			p.GatewayNode, p.Gateway = node, n.Addr
			return p, true
		}
	}
	return p, false
}

// Node is one node of the plan.
type Node struct {
	Name     string         `json:"name"`
	Addr     netip.Addr     `json:"addr"`
	PodCIDRs []netip.Prefix `json:"podCIDRs"`
	// Blocks are the pod blocks a CNI with its own IPAM allocated to the
	// node (Calico's block affinities, a CiliumNode, its pods' addresses),
	// given when PodCIDRs is empty. The gateway routes them to the node
	// as it does PodCIDRs, but no host source is taken from them: such a
	// CNI may give their first address to a pod.
	Blocks []netip.Prefix `json:"blocks,omitempty"`
}

// ParsePlan decodes and validates a plan.
func ParsePlan(b []byte) (Plan, error) {
	var p Plan
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Plan{}, fmt.Errorf("decode fabric plan: %w", err)
	}
	if dec.More() {
		return Plan{}, errors.New("decode fabric plan: trailing data")
	}
	if err := p.Validate(); err != nil {
		return Plan{}, err
	}
	return p, nil
}

// Validate checks what a node needs of the plan; the fabric checks the
// ranges themselves when it applies them.
func (p Plan) Validate() error {
	if p.GatewayNode == "" {
		return errors.New("fabric plan: no gateway node")
	}
	if !p.Gateway.IsValid() || !p.Gateway.Is4() {
		return fmt.Errorf("fabric plan: gateway address %v is not an IPv4 address", p.Gateway)
	}
	if p.TunnelInterface == "" {
		return errors.New("fabric plan: no tunnel interface")
	}
	if p.MTU != 0 && (p.MTU < 576 || p.MTU > 65535) {
		return fmt.Errorf("fabric plan: MTU %d out of range 576..65535", p.MTU)
	}
	for _, v := range p.Views {
		if err := ipam.CheckIPv4Range("fabric plan: view", v); err != nil {
			return err
		}
	}
	names := map[string]bool{}
	for _, n := range p.Nodes {
		if n.Name == "" || names[n.Name] {
			return fmt.Errorf("fabric plan: node name %q empty or listed twice", n.Name)
		}
		names[n.Name] = true
		for _, c := range slices.Concat(n.PodCIDRs, n.Blocks) {
			if err := ipam.CheckIPv4Range("fabric plan: pod block of node "+n.Name, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// Marshal encodes the plan in a stable order, so an unchanged plan is an
// unchanged ConfigMap.
func (p Plan) Marshal() ([]byte, error) {
	p.Views = slices.Clone(p.Views)
	slices.SortFunc(p.Views, comparePrefixes)
	p.Nodes = slices.Clone(p.Nodes)
	slices.SortFunc(p.Nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	return json.Marshal(p)
}

func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
