package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/peering"
)

// Networks are this cluster's own ranges.
type Networks struct {
	Pods     []netip.Prefix
	Services []netip.Prefix
	// Source says where each came from, for the log.
	PodSource, ServiceSource string
}

// detectNetworks returns the cluster's pod and service ranges: the flags
// when given, otherwise what the cluster says (kubeadm's configuration,
// the ServiceCIDR objects, the nodes' spec.podCIDRs), otherwise an error
// that names the flag to set.
func detectNetworks(ctx context.Context, kube kubernetes.Interface, pods, services []netip.Prefix) (Networks, error) {
	n := Networks{Pods: pods, Services: services, PodSource: "--pod-cidr", ServiceSource: "--service-cidr"}
	var kubeadm struct {
		Networking struct {
			PodSubnet     string `json:"podSubnet"`
			ServiceSubnet string `json:"serviceSubnet"`
		} `json:"networking"`
	}
	if len(n.Pods) == 0 || len(n.Services) == 0 {
		cm, err := kube.CoreV1().ConfigMaps("kube-system").Get(ctx, "kubeadm-config", metav1.GetOptions{})
		if err == nil {
			if err := yaml.Unmarshal([]byte(cm.Data["ClusterConfiguration"]), &kubeadm); err != nil {
				return n, fmt.Errorf("read kube-system/kubeadm-config: %w", err)
			}
		} else if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			return n, fmt.Errorf("read kube-system/kubeadm-config: %w", err)
		}
	}
	if len(n.Pods) == 0 && kubeadm.Networking.PodSubnet != "" {
		p, err := parsePrefixes(kubeadm.Networking.PodSubnet)
		if err != nil {
			return n, fmt.Errorf("kubeadm podSubnet: %w", err)
		}
		n.Pods, n.PodSource = p, "kubeadm-config"
	}
	if len(n.Pods) == 0 {
		nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return n, fmt.Errorf("list nodes for their pod ranges: %w", err)
		}
		for _, node := range nodes.Items {
			for _, c := range node.Spec.PodCIDRs {
				p, err := netip.ParsePrefix(c)
				if err == nil && !slices.Contains(n.Pods, p.Masked()) {
					n.Pods = append(n.Pods, p.Masked())
				}
			}
		}
		n.PodSource = "nodes' spec.podCIDRs"
	}
	if len(n.Services) == 0 {
		list, err := kube.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, sc := range list.Items {
				for _, c := range sc.Spec.CIDRs {
					if p, err := netip.ParsePrefix(c); err == nil {
						n.Services = append(n.Services, p.Masked())
					}
				}
			}
			n.ServiceSource = "ServiceCIDR objects"
		} else if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			return n, fmt.Errorf("list ServiceCIDRs: %w", err)
		}
	}
	if len(n.Services) == 0 && kubeadm.Networking.ServiceSubnet != "" {
		p, err := parsePrefixes(kubeadm.Networking.ServiceSubnet)
		if err != nil {
			return n, fmt.Errorf("kubeadm serviceSubnet: %w", err)
		}
		n.Services, n.ServiceSource = p, "kubeadm-config"
	}
	if len(n.Pods) == 0 {
		return n, fmt.Errorf("cannot tell this cluster's pod network (no kubeadm-config, no node has spec.podCIDRs): pass --pod-cidr, e.g. --pod-cidr=10.244.0.0/16")
	}
	if len(n.Services) == 0 {
		return n, fmt.Errorf("cannot tell this cluster's service network (no ServiceCIDR objects, no kubeadm-config): pass --service-cidr, e.g. --service-cidr=10.96.0.0/12")
	}
	return n, nil
}

// parsePrefixes parses a comma-separated list of canonical CIDRs.
func parsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := ParseCIDR(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// ParseCIDR parses a canonical CIDR ("10.0.0.0/16", not "10.0.0.1/16").
func ParseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("CIDR %q: %w", s, err)
	}
	if p != p.Masked() {
		return netip.Prefix{}, fmt.Errorf("CIDR %q has host bits set; did you mean %s?", s, p.Masked())
	}
	return p, nil
}

// startNetworks finds this cluster's networks, gives them and the gateway's
// address to the ledger as local networks, remapping the views that
// overlap one, and returns the pod ranges to announce.
func (a *Agent) startNetworks(ctx context.Context, ledger *ipam.Ledger, gateway netip.Addr) ([]netip.Prefix, error) {
	nets, err := detectNetworks(ctx, a.kube, a.cfg.PodCIDRs, a.cfg.ServiceCIDRs)
	if err != nil {
		return nil, err
	}
	a.log.Info("local networks", "pods", nets.Pods, "from", nets.PodSource, "services", nets.Services, "servicesFrom", nets.ServiceSource)
	announced, err := a.announced(nets.Pods)
	if err != nil {
		return nil, err
	}
	// The gateway's own address is local too: a peer range that covers it
	// is remapped rather than routed into the tunnel.
	locals := []ipam.LocalNetwork{{Range: netip.PrefixFrom(gateway, gateway.BitLen()), Kind: ipam.NodeNetwork}}
	for _, p := range nets.Pods {
		locals = append(locals, ipam.LocalNetwork{Range: p, Kind: ipam.PodNetwork})
	}
	for _, p := range nets.Services {
		locals = append(locals, ipam.LocalNetwork{Range: p, Kind: ipam.ServiceNetwork})
	}
	conflicts, err := ledger.SetLocalNetworks(locals)
	if err != nil {
		return nil, fmt.Errorf("record local networks: %w", err)
	}
	for _, c := range conflicts {
		view, err := ledger.Remap(c.View.Peer, c.View.Remote)
		if err != nil {
			return nil, fmt.Errorf("remap the view of %s's %s, which now overlaps a local network: %w", c.View.Peer, c.View.Remote, err)
		}
		a.log.Warn("view remapped: it overlapped a local network", "peer", c.View.Peer, "range", c.View.Remote, "old", c.View.View, "new", view)
	}
	return announced, nil
}

// announced returns the pod ranges peers are told about. The tunnel routes
// IPv4 only for now: IPv6 pod ranges stay local networks in the ledger
// (views avoid them) but are not announced.
func (a *Agent) announced(pods []netip.Prefix) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, p := range pods {
		if !p.Addr().Is4() {
			a.log.Warn("IPv6 pod range not announced to peers: the tunnel routes IPv4 only", "range", p)
			continue
		}
		if err := peering.CheckNetwork(p); err != nil {
			return nil, fmt.Errorf("pod range %s cannot be announced to peers: %w", p, err)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no IPv4 pod range among %v: the tunnel routes IPv4 only; pass --pod-cidr with this cluster's IPv4 pod range", pods)
	}
	return out, nil
}
