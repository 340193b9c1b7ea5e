package harness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// LANAPIPort is where a control plane on a LAN serves its API, as kubeadm's
// API servers do.
const LANAPIPort = 6443

// apiFront gives a control plane's API server an address on a LAN, the way
// a real cluster's API server sits on its network: a namespace of its own
// attached to the LAN (interface lan0), relaying <addr>:6443 to the API
// server on the host's loopback. It is a namespace of the run, removed
// with it, and its relay runs in the test process: nothing host-wide.
type apiFront struct {
	ns   *Netns
	addr netip.Addr
}

// newAPIFront attaches a namespace for control plane cp to lan. It comes
// before the control plane's certificates, which must name its address.
func (e *Env) newAPIFront(cp string, lan *LAN) (*apiFront, error) {
	// Two dashes: no site, pod or node namespace is named so.
	ns, err := e.newNetns(cp + "-api-lan")
	if err != nil {
		return nil, err
	}
	addr, err := lan.attach(ns, "lan0", "a-"+cp)
	if err != nil {
		return nil, fmt.Errorf("attach the API server of %s to the LAN: %w", cp, err)
	}
	return &apiFront{ns: ns, addr: addr}, nil
}

// serve relays the front's address to the API server at to until the test
// ends.
func (f *apiFront) serve(to netip.AddrPort) error {
	at := netip.AddrPortFrom(f.addr, LANAPIPort)
	l, err := f.ns.Listen("tcp", at.String())
	if err != nil {
		return fmt.Errorf("listen on %s for the API server: %w", at, err)
	}
	fw := newForwarder(l, to.String())
	f.ns.env.t.Cleanup(fw.Close)
	return nil
}

// LANURL is the API server's URL on the LAN of ControlPlaneOptions.LAN
// (https://<addr>:6443), as clusters on that LAN reach it; "" when the
// control plane is on no LAN. Its serving certificate names the address.
func (cp *ControlPlane) LANURL() string {
	if !cp.LANAddr.IsValid() {
		return ""
	}
	return "https://" + netip.AddrPortFrom(cp.LANAddr, LANAPIPort).String()
}

// CA returns the PEM of the control plane's certificate authority, which
// signed the API server's serving certificate.
func (cp *ControlPlane) CA() []byte { return cp.pki.caPEM }

// CAFile is the path of the same PEM, for flags such as --api-server-ca.
func (cp *ControlPlane) CAFile() string { return cp.pki.caCert }

// APIServerVersion GETs /version of the API server at url from inside the
// namespace, trusting only the CA bundle ca, and returns its gitVersion:
// whether a client there reaches the API server over verified TLS.
func (n *Netns) APIServerVersion(url string, ca []byte) (string, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return "", errors.New("no certificate in the CA bundle")
	}
	client := &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext:     n.DialContext,
			TLSClientConfig: &tls.Config{RootCAs: pool},
		},
	}
	defer client.CloseIdleConnections()
	resp, err := client.Get(url + "/version")
	if err != nil {
		return "", fmt.Errorf("from %s: %w", n.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("from %s: GET %s/version: %w", n.Name, url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("from %s: GET %s/version: %s: %s", n.Name, url, resp.Status, body)
	}
	var v struct {
		GitVersion string `json:"gitVersion"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return "", fmt.Errorf("from %s: GET %s/version: %w", n.Name, url, err)
	}
	return v.GitVersion, nil
}

// PublishClusterInfo writes kube-public/cluster-info as kubeadm does: a
// kubeconfig with the API server's LAN URL and its CA, meant for clients
// outside the cluster (a provider's agent announces it to its consumers).
func (cp *ControlPlane) PublishClusterInfo(ctx context.Context) error {
	if !cp.LANAddr.IsValid() {
		return fmt.Errorf("%s: cluster-info: the control plane has no LAN address", cp.Name)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[""] = &clientcmdapi.Cluster{Server: cp.LANURL(), CertificateAuthorityData: cp.CA()}
	raw, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("%s: cluster-info: %w", cp.Name, err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cluster-info", Namespace: "kube-public"}, Data: map[string]string{"kubeconfig": string(raw)}}
	if _, err := cp.Client.CoreV1().ConfigMaps("kube-public").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("%s: create kube-public/cluster-info: %w", cp.Name, err)
	}
	return nil
}
