package agent

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/agent/gatewayservice"
)

// gatewayAddrs are the gateway's addresses: its own (the node's, which
// the local networks, the fabric and the node address start from), where
// it listens, and what it advertises to peers for WireGuard and gossip.
type gatewayAddrs struct {
	own               netip.Addr
	listen            gatewayservice.Ports
	wireguard, gossip netip.AddrPort
}

// gatewayAddresses finds the gateway's addresses. With --gateway-service
// it applies the Service first and advertises what that gives (the node
// ports or the load balancer's address); without, it advertises its own
// address (a Service an earlier run left goes later, removeGatewayService).
func (a *Agent) gatewayAddresses(ctx context.Context) (gatewayAddrs, error) {
	own := a.cfg.AdvertiseAddr
	if !own.IsValid() {
		var err error
		if own, err = defaultAddress(); err != nil {
			return gatewayAddrs{}, err
		}
	}
	listen := gatewayservice.Ports{WireGuard: uint16(a.cfg.WireGuardPort), Gossip: a.cfg.GossipAddr.Port()}
	if !a.exposesGatewayService() {
		return gatewayAddrs{own: own, listen: listen,
			wireguard: netip.AddrPortFrom(own, listen.WireGuard), gossip: netip.AddrPortFrom(own, listen.Gossip)}, nil
	}
	svc := &gatewayservice.Service{
		Client: a.kube.CoreV1(), Namespace: a.agentNamespace(), Type: a.cfg.GatewayService,
		Selector: a.agentSelector(), Listen: listen, Log: a.log.With("component", "gateway service"),
	}
	var err error
	if svc.NodeAddr, err = a.gatewayNodeAddress(ctx, own); err != nil {
		return gatewayAddrs{}, err
	}
	if a.cfg.FabricOwner != "" {
		d, err := a.kube.AppsV1().Deployments(a.agentNamespace()).Get(ctx, a.cfg.FabricOwner, metav1.GetOptions{})
		if err != nil {
			return gatewayAddrs{}, fmt.Errorf("read the agent's Deployment %s/%s, the gateway Service's owner: %w", a.agentNamespace(), a.cfg.FabricOwner, err)
		}
		svc.Owner = &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID}
	}
	exposed, err := svc.Ensure(ctx)
	if err != nil {
		return gatewayAddrs{}, err
	}
	a.log.Info("gateway exposed through its Service", "service", a.agentNamespace()+"/"+gatewayservice.Name, "type", a.cfg.GatewayService,
		"wireguard", exposed.WireGuard(), "gossip", exposed.Gossip(), "listen", exposed.Listen)
	return gatewayAddrs{own: own, listen: exposed.Listen, wireguard: exposed.WireGuard(), gossip: exposed.Gossip()}, nil
}

// agentSelector selects the agent's pods. Not by the active replica's
// role label, which comes only once the agent has started: peers reach
// it while it joins. With the Service's external traffic policy Local a
// packet goes only to the agent on the node it arrives at, the active
// replica's, whose address is the one advertised.
func (a *Agent) agentSelector() map[string]string {
	return map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/component": "agent"}
}

// gatewayNodeAddress is the address advertised with the node ports:
// --advertise-addr when given, else the gateway Node's external IPv4
// address, else its internal one, else own.
func (a *Agent) gatewayNodeAddress(ctx context.Context, own netip.Addr) (netip.Addr, error) {
	if a.cfg.AdvertiseAddr.IsValid() || a.cfg.NodeName == "" {
		return own, nil
	}
	node, err := a.kube.CoreV1().Nodes().Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read the gateway node %s for the address to advertise with its node ports: %w", a.cfg.NodeName, err)
	}
	for _, kind := range []corev1.NodeAddressType{corev1.NodeExternalIP, corev1.NodeInternalIP} {
		for _, na := range node.Status.Addresses {
			if ip, err := netip.ParseAddr(na.Address); err == nil && na.Type == kind && ip.Is4() {
				return ip, nil
			}
		}
	}
	return own, nil
}

// exposesGatewayService reports whether --gateway-service asks for a
// Service.
func (a *Agent) exposesGatewayService() bool {
	return a.cfg.GatewayService != gatewayservice.None && a.cfg.GatewayService != ""
}

// startGatewayServiceRemoval removes, without --gateway-service, the
// Service an earlier run with it made. Not on the network path: it is
// started after the join, so its API requests do not delay reading the
// networks.
func (a *Agent) startGatewayServiceRemoval(comps *components) {
	if !a.exposesGatewayService() {
		comps.Go("gateway Service removal", a.removeGatewayService)
	}
}

// removeGatewayService removes the Service an earlier run with
// --gateway-service made; a Service of that name that is not the
// agent's stays. Then it waits for the agent to stop: a component that
// returns first stops the agent.
func (a *Agent) removeGatewayService(ctx context.Context) error {
	removed, err := gatewayservice.Remove(ctx, a.kube.CoreV1(), a.agentNamespace())
	switch {
	case err != nil && ctx.Err() == nil:
		a.log.Warn("gateway Service not removed; it is removed at the next start", "error", err)
	case removed:
		a.log.Info("removed the gateway Service (--gateway-service=None)", "service", a.agentNamespace()+"/"+gatewayservice.Name)
	}
	<-ctx.Done()
	return nil
}
