// Package gatewayservice is the Service through which the agent exposes
// its gateway (`--gateway-service`): WireGuard (UDP) and gossip (TCP and
// UDP) behind a NodePort or LoadBalancer Service of the agent's own, and
// the address and ports that Service gives, which the agent advertises to
// its peers instead of the node's address.
//
// In NodePort mode the agent listens on the node ports themselves (the
// Service's target ports are its node ports): what the gateway sends then
// leaves from the port it advertises, so a peer's WireGuard, which takes
// a peer's endpoint from where its packets come from (roaming), keeps the
// address a firewall lets in.
package gatewayservice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Type is the kind of Service the gateway is exposed through.
type Type string

const (
	// None: no Service; peers reach the gateway node's own address.
	None Type = "None"
	// NodePort: the gateway node's address and the Service's node ports.
	NodePort Type = "NodePort"
	// LoadBalancer: the load balancer's ingress address and the
	// Service's ports.
	LoadBalancer Type = "LoadBalancer"
)

// ParseType reads a --gateway-service value.
func ParseType(s string) (Type, error) {
	switch t := Type(s); t {
	case None, NodePort, LoadBalancer:
		return t, nil
	case "":
		return None, nil
	}
	return "", fmt.Errorf("%q: want None, NodePort or LoadBalancer", s)
}

// Name is the Service's, in the agent's namespace.
const Name = "flotilla-gateway"

// Labels mark the Service as the agent's own; the admission policy
// flotilla-agent-gateway-service lets the agent write no other Service
// of this kind.
var Labels = map[string]string{
	"app.kubernetes.io/name":       "flotilla",
	"app.kubernetes.io/component":  "gateway",
	"app.kubernetes.io/managed-by": "flotilla",
}

// Port names in the Service.
const (
	PortWireGuard = "wireguard"
	PortGossipTCP = "gossip"
	PortGossipUDP = "gossip-udp"
)

// fieldManager owns the fields the agent applies.
const fieldManager = "flotilla-agent"

// Ports are where the agent listens, or what it advertises.
type Ports struct {
	WireGuard, Gossip uint16
}

// Exposed is what the Service gives: where peers reach the gateway
// (Addr and Advertised) and where the agent must listen for that
// (Listen).
type Exposed struct {
	Addr       netip.Addr
	Advertised Ports
	Listen     Ports
}

// WireGuard is the endpoint peers send WireGuard to.
func (e Exposed) WireGuard() netip.AddrPort {
	return netip.AddrPortFrom(e.Addr, e.Advertised.WireGuard)
}

// Gossip is the gossip address members reach.
func (e Exposed) Gossip() netip.AddrPort {
	return netip.AddrPortFrom(e.Addr, e.Advertised.Gossip)
}

// Service keeps the gateway's Service.
type Service struct {
	Client    corev1client.ServicesGetter
	Namespace string
	Type      Type
	// Selector selects the agent's pod that runs the data path.
	Selector map[string]string
	// Owner, when set, owns the Service: it goes with the agent's
	// Deployment.
	Owner *metav1.OwnerReference
	// Listen are the agent's ports without a Service (--wireguard-port,
	// the port of --gossip-addr); the Service's ports.
	Listen Ports
	// NodeAddr is the gateway node's address, advertised with the node
	// ports (NodePort).
	NodeAddr netip.Addr
	// Resolve looks up a load balancer's host name; nil: the system's
	// resolver.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	Log     *slog.Logger
}

// Ensure applies the Service and returns what it exposes, waiting (until
// ctx ends) for a load balancer to give it an address.
func (s *Service) Ensure(ctx context.Context) (Exposed, error) {
	if s.Type != NodePort && s.Type != LoadBalancer {
		return Exposed{}, fmt.Errorf("gateway Service of type %q: want NodePort or LoadBalancer", s.Type)
	}
	svcs := s.Client.Services(s.Namespace)
	cur, err := svcs.Get(ctx, Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cur = nil
	case err != nil:
		return Exposed{}, fmt.Errorf("read the gateway Service %s/%s: %w", s.Namespace, Name, err)
	case !Ours(cur):
		return Exposed{}, fmt.Errorf("the Service %s/%s exists and is not the agent's (not labelled app.kubernetes.io/component=gateway, app.kubernetes.io/managed-by=flotilla): delete or rename it, or run with --gateway-service=None", s.Namespace, Name)
	}
	// Node ports are allocated on the first apply; the second gives the
	// gossip's UDP port the TCP one's number and points the target ports
	// at the node ports. The first always goes: it puts back what someone
	// changed (selector, labels, policy).
	for i := range 3 {
		want := s.desired(cur)
		if i > 0 && applied(cur, want) {
			break
		}
		if cur, err = svcs.Apply(ctx, want, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
			return Exposed{}, fmt.Errorf("apply the gateway Service %s/%s (%s): %w", s.Namespace, Name, s.Type, err)
		}
	}
	if s.Type == NodePort {
		return s.nodePorts(cur)
	}
	return s.loadBalancer(ctx, cur)
}

// desired is the Service, with the node ports cur was given (NodePort).
func (s *Service) desired(cur *corev1.Service) *corev1ac.ServiceApplyConfiguration {
	node := map[string]int32{}
	if cur != nil && s.Type == NodePort {
		for _, p := range cur.Spec.Ports {
			node[p.Name] = p.NodePort
		}
		if node[PortGossipTCP] != 0 {
			node[PortGossipUDP] = node[PortGossipTCP]
		}
	}
	port := func(name string, proto corev1.Protocol, listen uint16) *corev1ac.ServicePortApplyConfiguration {
		p := corev1ac.ServicePort().WithName(name).WithProtocol(proto).WithPort(int32(listen)).
			WithTargetPort(intstr.FromInt32(int32(listen)))
		if np := node[name]; np != 0 {
			p = p.WithNodePort(np).WithTargetPort(intstr.FromInt32(np))
		}
		return p
	}
	svc := corev1ac.Service(Name, s.Namespace).WithLabels(Labels).
		WithSpec(corev1ac.ServiceSpec().
			WithType(corev1.ServiceType(s.Type)).
			WithSelector(s.Selector).
			// Local: the peer's own address reaches the agent (no
			// masquerade), and only the node the agent runs on answers.
			WithExternalTrafficPolicy(corev1.ServiceExternalTrafficPolicyLocal).
			// Peers reach the gateway while the agent starts: it joins
			// the gossip before it is ready.
			WithPublishNotReadyAddresses(true).
			WithPorts(
				port(PortWireGuard, corev1.ProtocolUDP, s.Listen.WireGuard),
				port(PortGossipTCP, corev1.ProtocolTCP, s.Listen.Gossip),
				port(PortGossipUDP, corev1.ProtocolUDP, s.Listen.Gossip),
			))
	if s.Owner != nil {
		svc = svc.WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion(s.Owner.APIVersion).WithKind(s.Owner.Kind).WithName(s.Owner.Name).WithUID(s.Owner.UID))
	}
	return svc
}

// applied says whether cur already is want, in the fields the agent sets.
func applied(cur *corev1.Service, want *corev1ac.ServiceApplyConfiguration) bool {
	if string(cur.Spec.Type) != string(*want.Spec.Type) || len(cur.Spec.Ports) != len(want.Spec.Ports) {
		return false
	}
	for _, w := range want.Spec.Ports {
		found := false
		for _, c := range cur.Spec.Ports {
			if c.Name == *w.Name && c.Protocol == *w.Protocol && c.Port == *w.Port && c.TargetPort == *w.TargetPort &&
				(w.NodePort == nil || c.NodePort == *w.NodePort) {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// nodePorts is what a NodePort Service exposes: the node's address and
// the node ports, which the agent listens on.
func (s *Service) nodePorts(svc *corev1.Service) (Exposed, error) {
	if !s.NodeAddr.IsValid() {
		return Exposed{}, errors.New("the gateway Service is a NodePort, and the gateway node's address is unknown: pass --advertise-addr")
	}
	wg, gossip := nodePort(svc, PortWireGuard), nodePort(svc, PortGossipTCP)
	if wg == 0 || gossip == 0 || nodePort(svc, PortGossipUDP) != gossip {
		return Exposed{}, fmt.Errorf("the gateway Service %s/%s has no node ports for WireGuard and gossip (TCP and UDP on one port) after applying it: %s", s.Namespace, Name, describePorts(svc))
	}
	p := Ports{WireGuard: wg, Gossip: gossip}
	return Exposed{Addr: s.NodeAddr, Advertised: p, Listen: p}, nil
}

func nodePort(svc *corev1.Service, name string) uint16 {
	for _, p := range svc.Spec.Ports {
		if p.Name == name {
			return uint16(p.NodePort)
		}
	}
	return 0
}

func describePorts(svc *corev1.Service) string {
	s := ""
	for _, p := range svc.Spec.Ports {
		s += fmt.Sprintf(" %s %s/%d node port %d;", p.Name, p.Protocol, p.Port, p.NodePort)
	}
	return s
}

// loadBalancer waits for the load balancer's address: the ingress IP, or
// its host name's first IPv4 address.
func (s *Service) loadBalancer(ctx context.Context, svc *corev1.Service) (Exposed, error) {
	svcs := s.Client.Services(s.Namespace)
	logged := false
	for {
		addr, err := s.ingress(ctx, svc)
		if err != nil {
			return Exposed{}, err
		}
		if addr.IsValid() {
			return Exposed{Addr: addr, Advertised: s.Listen, Listen: s.Listen}, nil
		}
		if !logged {
			s.Log.Info("waiting for the load balancer's address of the gateway Service", "service", s.Namespace+"/"+Name)
			logged = true
		}
		if svc, err = waitForChange(ctx, svcs, svc.ResourceVersion); err != nil {
			return Exposed{}, fmt.Errorf("wait for the load balancer's address of the gateway Service %s/%s: %w", s.Namespace, Name, err)
		}
	}
}

// ingress is the load balancer's address, or none yet.
func (s *Service) ingress(ctx context.Context, svc *corev1.Service) (netip.Addr, error) {
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil && a.Is4() {
			return a, nil
		}
		if in.Hostname == "" {
			continue
		}
		resolve := s.Resolve
		if resolve == nil {
			resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
				return net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
			}
		}
		addrs, err := resolve(ctx, in.Hostname)
		if err != nil || len(addrs) == 0 {
			return netip.Addr{}, fmt.Errorf("the gateway Service's load balancer is %s, which does not resolve to an IPv4 address (%v): fix its DNS, or use --gateway-service=NodePort", in.Hostname, err)
		}
		return addrs[0].Unmap(), nil
	}
	return netip.Addr{}, nil
}

// waitForChange returns the Service once it is newer than rv.
func waitForChange(ctx context.Context, svcs corev1client.ServiceInterface, rv string) (*corev1.Service, error) {
	w, err := svcs.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + Name, ResourceVersion: rv})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	// A watch the API server closes (its timeout) is read again.
	timeout := time.NewTimer(5 * time.Minute)
	defer timeout.Stop()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return svcs.Get(ctx, Name, metav1.GetOptions{})
			}
			if svc, ok := ev.Object.(*corev1.Service); ok {
				return svc, nil
			}
		case <-timeout.C:
			return svcs.Get(ctx, Name, metav1.GetOptions{})
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// Ours says whether svc is the agent's gateway Service.
func Ours(svc *corev1.Service) bool {
	for k, v := range Labels {
		if svc.Labels[k] != v {
			return false
		}
	}
	return svc.Name == Name
}

// Remove deletes the gateway Service from namespace if it is the
// agent's; a Service of that name that is not is left alone.
func Remove(ctx context.Context, client corev1client.ServicesGetter, namespace string) (removed bool, err error) {
	svc, err := client.Services(namespace).Get(ctx, Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the gateway Service %s/%s: %w", namespace, Name, err)
	}
	if !Ours(svc) {
		return false, nil
	}
	err = client.Services(namespace).Delete(ctx, Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &svc.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("remove the gateway Service %s/%s (--gateway-service=None): %w", namespace, Name, err)
	}
	return true, nil
}
