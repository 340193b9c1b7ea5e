package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/ipam"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
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
func detectNetworks(ctx context.Context, kube kubeclient.Interface, pods, services []netip.Prefix) (Networks, error) {
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

// ParseCIDR parses a canonical CIDR ("10.0.0.0/16", not "10.0.0.1/16")
// with the ledger's one range check.
func ParseCIDR(s string) (netip.Prefix, error) {
	p, err := ipam.ParseRange(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("CIDR %q: %w", s, err)
	}
	return p, nil
}
