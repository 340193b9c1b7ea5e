package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/agent/gatewayservice"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The node ports b's operator chose and opened in its gateway node's
// firewall.
const (
	gatewayWireGuardNodePort = 30820
	gatewayGossipNodePort    = 30946
)

// gatewayFirewall admits on the gateway node's LAN interface only the
// gateway Service's node ports, the kubelet's API (the control plane's
// exec and logs) and replies to what the node sent: not WireGuard's
// 51820, not gossip's 7946, not mDNS.
var gatewayFirewall = fmt.Sprintf(`table inet flotest_gateway_firewall {
	chain input {
		type filter hook input priority filter; policy accept;
		iifname != "eth0" accept
		ct state established,related accept comment "replies to what the node sent"
		udp dport %[1]d accept comment "the gateway Service's WireGuard node port"
		tcp dport %[2]d accept comment "the gateway Service's gossip node port"
		udp dport %[2]d accept comment "the gateway Service's gossip node port"
		tcp dport 10250 accept comment "the kubelet's API, for the control plane"
		drop
	}
}
`, gatewayWireGuardNodePort, gatewayGossipNodePort)

// b exposes its gateway through a NodePort Service (--gateway-service
// =NodePort) behind a firewall on its gateway node that admits only the
// Service's node ports: a (on the LAN, no Service) reaches it there, the
// Peers connect both ways at the advertised node ports, and pods talk
// both ways; 7946 on b's node stays closed throughout. Back to None, b's
// agent removes the Service. Nothing of the run is left.
func TestGatewayServiceNodePort(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	var run string
	t.Run("federation", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		cs := federation.OnNodes(t, env, federation.NodeOptions{
			Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Later: []int{1},
		})
		a, b := cs[0], cs[1]
		ctx := t.Context()
		// b's operator picks the node ports and opens them, before the
		// agent runs: the agent keeps a Service's node ports.
		if err := federation.EnsureAgentNamespace(b.CP); err != nil {
			t.Fatal(err)
		}
		if _, err := b.CP.Client.CoreV1().Services(federation.AgentNamespace).Create(ctx, chosenGatewayService(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rules := filepath.Join(t.TempDir(), "firewall.nft")
		if err := os.WriteFile(rules, []byte(gatewayFirewall), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := b.Gateway.Exec(ctx, "nft", "-f", rules); err != nil {
			t.Fatalf("firewall on b's gateway node: %v: %s", err, out)
		}
		// b joins a: mDNS's queries and answers do not get through b's
		// firewall.
		join := "--join=" + netip.AddrPortFrom(a.Gateway.Addr, 7946).String()
		b.InstallAgent(t, []string{"--gateway-service=NodePort", join})
		federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 120*time.Second)

		t.Run("a reaches b at its node ports", func(t *testing.T) {
			peers, err := a.Peers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p := peers[b.Name]
			wantGossip := netip.AddrPortFrom(b.Gateway.Addr, gatewayGossipNodePort).String()
			wantWG := netip.AddrPortFrom(b.Gateway.Addr, gatewayWireGuardNodePort).String()
			if p.Status.Gossip != wantGossip || p.Status.Endpoint != wantWG {
				t.Errorf("a's Peer of b: gossip %s, endpoint %s; want %s and %s (b's node ports)", p.Status.Gossip, p.Status.Endpoint, wantGossip, wantWG)
			}
		})
		t.Run("pods on the gateway nodes talk both ways", func(t *testing.T) {
			for _, pair := range [][2]*federation.NodeCluster{{a, b}, {b, a}} {
				if r := federation.Fetch(t, pair[0], pair[1]); r.Err != nil {
					t.Errorf("%s -> %s (%s): %v", pair[0].Name, pair[1].Name, r.Dst, r.Err)
				}
			}
		})
		t.Run("only the node ports are open on b's gateway", func(t *testing.T) {
			// The positive witness first: the gossip node port answers a
			// connection from a's node, so a refusal of 7946 is the
			// firewall's, not an unreachable node.
			open := netip.AddrPortFrom(b.Gateway.Addr, gatewayGossipNodePort)
			if err := dialFrom(ctx, a.Gateway, open); err != nil {
				t.Fatalf("gossip node port %s from a's node: %v", open, err)
			}
			closed := netip.AddrPortFrom(b.Gateway.Addr, 7946)
			if err := dialFrom(ctx, a.Gateway, closed); err == nil {
				t.Errorf("%s answered from a's node: the firewall admits gossip's own port, so the test proves nothing", closed)
			}
		})
		t.Run("back to None, the Service goes", func(t *testing.T) {
			b.InstallAgent(t, []string{join})
			eventually.Within(t, 60*time.Second, "b's gateway Service removed", func() error {
				_, err := b.CP.Client.CoreV1().Services(federation.AgentNamespace).Get(ctx, gatewayservice.Name, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return nil
				}
				return fmt.Errorf("still there (%v)", err)
			})
		})
	})
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("run %s left behind: %v", run, left)
	}
}

// chosenGatewayService is the gateway Service as an operator creates it
// ahead of the agent to choose its node ports: labelled as the agent's,
// which applies over it and keeps them.
func chosenGatewayService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: gatewayservice.Name, Namespace: federation.AgentNamespace, Labels: gatewayservice.Labels},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/component": "agent"},
			Ports: []corev1.ServicePort{
				{Name: gatewayservice.PortWireGuard, Protocol: corev1.ProtocolUDP, Port: 51820, NodePort: gatewayWireGuardNodePort},
				{Name: gatewayservice.PortGossipTCP, Protocol: corev1.ProtocolTCP, Port: 7946, NodePort: gatewayGossipNodePort},
				{Name: gatewayservice.PortGossipUDP, Protocol: corev1.ProtocolUDP, Port: 7946, NodePort: gatewayGossipNodePort},
			},
		},
	}
}

// dialFrom opens a TCP connection to addr from node's network namespace
// and closes it.
func dialFrom(ctx context.Context, node *harness.Node, addr netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := node.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return err
	}
	return c.Close()
}
