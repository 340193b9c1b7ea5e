package tenancy

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// APIServer is what a provider announces to its consumers: where they
// reach its API server and the CA bundle that verifies it.
type APIServer struct {
	URL    string
	CAData []byte
	// Source says where URL came from (one of the Source constants).
	Source string
	// Skipped says why sources tried before Source were not used, for one
	// log line.
	Skipped []string
}

// Where FindAPIServer found the API server, in the order it looks.
const (
	SourceFlag          = "--api-server-url"
	SourceClusterInfo   = "ConfigMap kube-public/cluster-info"
	SourceEndpointSlice = "EndpointSlice default/kubernetes"
)

// FindAPIServer returns the API server URL and CA bundle a provider
// announces, from the first source that has a usable one:
//
//  1. the agent's flags, flagURL and flagCAFile (default: the agent's own
//     CA bundle, from own);
//  2. kubeadm's public cluster-info ConfigMap in kube-public, written for
//     clients outside the cluster;
//  3. the kubernetes EndpointSlice in default, the API server's advertised
//     address, with the agent's own CA bundle.
//
// An address no peer can reach is refused from every source, the flag
// included: a loopback, unspecified, link-local or multicast address, the
// name localhost, a cluster DNS name (kubernetes, *.svc, *.cluster.local),
// or an address of the kubernetes Service (10.96.0.1). Each of those, dialed
// by a consumer, names the consumer's own host or cluster, so a grant built
// on it would point the consumer at itself. Any other host name in the flag
// is taken as written: it resolves on the consumer's side, which only the
// user knows (a tunnel, split DNS). A flag that is wrong is an error, never
// a reason to fall back to discovery.
func FindAPIServer(ctx context.Context, client kubeclient.Interface, own *rest.Config, flagURL, flagCAFile string) (APIServer, error) {
	serviceIPs, err := kubernetesServiceIPs(ctx, client)
	if err != nil {
		return APIServer{}, err
	}
	if flagURL != "" || flagCAFile != "" {
		return fromFlags(own, flagURL, flagCAFile, serviceIPs)
	}
	var skipped []string
	for _, find := range []struct {
		source string
		find   func(context.Context, kubeclient.Interface, *rest.Config) (APIServer, error)
	}{
		{SourceClusterInfo, fromClusterInfo},
		{SourceEndpointSlice, fromEndpointSlice},
	} {
		s, err := find.find(ctx, client, own)
		if err == nil {
			err = checkAnnounceable(s.URL, serviceIPs)
		}
		if err == nil {
			s.Source, s.Skipped = find.source, skipped
			return s, nil
		}
		skipped = append(skipped, fmt.Sprintf("%s: %v", find.source, err))
	}
	return APIServer{}, fmt.Errorf("no API server address to announce to consumers: set --api-server-url to the https URL other clusters reach this cluster's API server at (and --api-server-ca to its CA bundle if the agent's own does not verify it); %s", strings.Join(skipped, "; "))
}

// fromFlags checks the agent's flags; the CA defaults to the agent's own.
func fromFlags(own *rest.Config, flagURL, flagCAFile string, serviceIPs []netip.Addr) (APIServer, error) {
	if flagURL == "" {
		return APIServer{}, fmt.Errorf("--api-server-ca %s is set but --api-server-url is not: set both, or neither to find the API server from the cluster", flagCAFile)
	}
	if err := checkAnnounceable(flagURL, serviceIPs); err != nil {
		return APIServer{}, fmt.Errorf("--api-server-url: %w", err)
	}
	s := APIServer{URL: flagURL, Source: SourceFlag}
	if flagCAFile == "" {
		ca, err := ownCA(own)
		if err != nil {
			return APIServer{}, fmt.Errorf("--api-server-url %s without --api-server-ca: %w; set --api-server-ca", flagURL, err)
		}
		s.CAData = ca
		return s, nil
	}
	ca, err := os.ReadFile(flagCAFile)
	if err != nil {
		return APIServer{}, fmt.Errorf("--api-server-ca: %w", err)
	}
	if err := checkCA(ca); err != nil {
		return APIServer{}, fmt.Errorf("--api-server-ca %s: %w", flagCAFile, err)
	}
	s.CAData = ca
	return s, nil
}

// fromClusterInfo reads kubeadm's cluster-info ConfigMap: a kubeconfig
// with the API server's public address and CA, for clients joining from
// outside the cluster.
func fromClusterInfo(ctx context.Context, client kubeclient.Interface, own *rest.Config) (APIServer, error) {
	cm, err := client.CoreV1().ConfigMaps("kube-public").Get(ctx, "cluster-info", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return APIServer{}, errors.New("none (not a kubeadm cluster)")
	}
	if err != nil {
		return APIServer{}, err
	}
	raw, ok := cm.Data["kubeconfig"]
	if !ok {
		return APIServer{}, errors.New("no kubeconfig key")
	}
	cfg, err := clientcmd.Load([]byte(raw))
	if err != nil {
		return APIServer{}, fmt.Errorf("its kubeconfig: %w", err)
	}
	name := ""
	if c, ok := cfg.Contexts[cfg.CurrentContext]; ok {
		name = c.Cluster
	} else if len(cfg.Clusters) == 1 {
		for n := range cfg.Clusters { // kubeadm writes one cluster, named ""
			name = n
		}
	}
	cluster, ok := cfg.Clusters[name]
	if !ok {
		return APIServer{}, fmt.Errorf("its kubeconfig names %d clusters and no current context: cannot tell which is this one", len(cfg.Clusters))
	}
	ca := cluster.CertificateAuthorityData
	if len(ca) == 0 {
		if ca, err = ownCA(own); err != nil {
			return APIServer{}, fmt.Errorf("its kubeconfig has no certificate-authority-data and %w", err)
		}
	} else if err := checkCA(ca); err != nil {
		return APIServer{}, fmt.Errorf("its certificate-authority-data: %w", err)
	}
	return APIServer{URL: cluster.Server, CAData: ca}, nil
}

// fromEndpointSlice reads the address the API server advertises for the
// kubernetes Service (--advertise-address, --secure-port): the node's
// address, reachable from peers when the node is.
func fromEndpointSlice(ctx context.Context, client kubeclient.Interface, own *rest.Config) (APIServer, error) {
	// The API server's own reconciler names the slice after the Service.
	es, err := client.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return APIServer{}, errors.New("none (the API server's endpoint reconciler is off)")
	}
	if err != nil {
		return APIServer{}, err
	}
	port, err := httpsPort(es)
	if err != nil {
		return APIServer{}, err
	}
	var addr netip.Addr
	for _, e := range es.Endpoints {
		if e.Conditions.Ready != nil && !*e.Conditions.Ready {
			continue
		}
		for _, a := range e.Addresses {
			if ip, err := netip.ParseAddr(a); err == nil {
				addr = ip
				break
			}
		}
		if addr.IsValid() {
			break
		}
	}
	if !addr.IsValid() {
		return APIServer{}, errors.New("no ready endpoint with an IP address")
	}
	ca, err := ownCA(own)
	if err != nil {
		return APIServer{}, err
	}
	return APIServer{URL: "https://" + netip.AddrPortFrom(addr, port).String(), CAData: ca}, nil
}

// httpsPort is the slice's port: the one named https, or its only one.
func httpsPort(es *discoveryv1.EndpointSlice) (uint16, error) {
	for _, p := range es.Ports {
		if p.Port != nil && (len(es.Ports) == 1 || (p.Name != nil && *p.Name == "https")) {
			return uint16(*p.Port), nil
		}
	}
	return 0, fmt.Errorf("no port named https among %d", len(es.Ports))
}

// ownCA is the CA bundle the agent itself verifies its API server with.
func ownCA(own *rest.Config) ([]byte, error) {
	ca := own.CAData
	if len(ca) == 0 && own.CAFile != "" {
		var err error
		if ca, err = os.ReadFile(own.CAFile); err != nil {
			return nil, fmt.Errorf("the agent's own CA bundle: %w", err)
		}
	}
	if len(ca) == 0 {
		return nil, errors.New("the agent's own configuration has no CA bundle to send")
	}
	if err := checkCA(ca); err != nil {
		return nil, fmt.Errorf("the agent's own CA bundle: %w", err)
	}
	return ca, nil
}

// checkCA accepts PEM holding one or more certificates and nothing else.
func checkCA(ca []byte) error {
	n := 0
	for rest := ca; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			if len(strings.TrimSpace(string(rest))) > 0 {
				return errors.New("not PEM (want one or more CERTIFICATE blocks)")
			}
			break
		}
		if b.Type != "CERTIFICATE" {
			return fmt.Errorf("a %s block: want only CERTIFICATE blocks", b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("certificate %d: %w", n+1, err)
		}
		n++
	}
	if n == 0 {
		return errors.New("no certificate")
	}
	return nil
}

// kubernetesServiceIPs are the cluster IPs of the kubernetes Service
// (10.96.0.1): in-cluster addresses no peer can reach.
func kubernetesServiceIPs(ctx context.Context, client kubeclient.Interface) ([]netip.Addr, error) {
	svc, err := client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read Service default/kubernetes, whose address no peer can reach: %w", err)
	}
	var ips []netip.Addr
	for _, s := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
		if ip, err := netip.ParseAddr(s); err == nil {
			ips = append(ips, ip)
		}
	}
	return ips, nil
}

// checkAnnounceable accepts an https URL whose host a peer can reach: see
// FindAPIServer for what is refused and why.
func checkAnnounceable(raw string, serviceIPs []netip.Addr) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %w", raw, err)
	}
	if u.Scheme != "https" {
		return fmt.Errorf("%q: want an https URL (https://host[:port])", raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q: want https://host[:port] without user, query or fragment", raw)
	}
	host := u.Hostname()
	if host == "" {
		return fmt.Errorf("%q has no host", raw)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q: port %q out of range", raw, p)
		}
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return checkAnnounceableName(raw, strings.ToLower(strings.TrimSuffix(host, ".")))
	}
	ip = ip.Unmap()
	switch {
	case ip.IsLoopback():
		return fmt.Errorf("%s is a loopback address: a consumer dialing it reaches itself", raw)
	case ip.IsUnspecified():
		return fmt.Errorf("%s has the unspecified address %s: nobody can dial it", raw, ip)
	case ip.IsLinkLocalUnicast(), ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		return fmt.Errorf("%s is a link-local or multicast address: no peer can reach it across networks", raw)
	}
	for _, s := range serviceIPs {
		if ip == s.Unmap() {
			return fmt.Errorf("%s is the address of the kubernetes Service inside this cluster: a consumer dialing it reaches its own cluster's API server", raw)
		}
	}
	return nil
}

// checkAnnounceableName refuses names that resolve to the consumer itself
// or only inside a cluster.
func checkAnnounceableName(raw, host string) error {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return fmt.Errorf("%s names localhost: a consumer dialing it reaches itself", raw)
	}
	if host == "kubernetes" || host == "kubernetes.default" ||
		strings.HasSuffix(host, ".svc") || strings.Contains(host, ".svc.") || strings.HasSuffix(host, ".cluster.local") {
		return fmt.Errorf("%s is a cluster DNS name: it resolves only inside a cluster, and in a consumer's to its own", raw)
	}
	return nil
}
