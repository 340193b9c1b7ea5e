package agent

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/flotilla-io/flotilla/offload/dnsforward"
	"github.com/flotilla-io/flotilla/offload/mcsdns"
)

// ClustersetDNSService is deploy/'s Service in front of the agent's
// clusterset.local DNS, in the agent's namespace: the stable address
// CoreDNS forwards the zone to.
const ClustersetDNSService = "flotilla-clusterset-dns"

// defaultCoreDNS is CoreDNS's ConfigMap as kubeadm installs it, where the
// agent takes out its block when --coredns-forward is off.
var defaultCoreDNS = types.NamespacedName{Namespace: "kube-system", Name: "coredns"}

// coreDNSConfigMap parses --coredns-forward ("namespace/name"; "": none).
func coreDNSConfigMap(flag string) (types.NamespacedName, error) {
	if flag == "" {
		return types.NamespacedName{}, nil
	}
	ns, name, ok := strings.Cut(flag, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("--coredns-forward %q: want namespace/name of CoreDNS's ConfigMap, such as kube-system/coredns", flag)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// startClustersetDNS answers the clusterset.local zone (the Multi-Cluster
// Services API's names) on the gateway node's address, where CoreDNS
// forwards the zone (docs/services.md, "DNS"); --clusterset-dns-port=0
// leaves it off.
func (a *Agent) startClustersetDNS(ctx context.Context, comps *components) error {
	if a.cfg.ClustersetDNSPort == 0 {
		return nil
	}
	if !a.warm.answersDNS() {
		if err := a.serveClustersetDNS(comps); err != nil {
			return err
		}
	}
	return a.startCoreDNSForward(comps)
}

// serveClustersetDNS starts the clusterset.local DNS server. It reads
// the API server and writes nothing, so a standby runs it too
// (warmStandby).
func (a *Agent) serveClustersetDNS(comps *components) error {
	srv, err := mcsdns.New(mcsdns.Config{
		Config:     a.restCfg,
		Address:    netip.AddrPortFrom(a.cfg.NodeAddress, uint16(a.cfg.ClustersetDNSPort)),
		ClientRate: a.cfg.ClustersetDNSClientRate, ClientBurst: a.cfg.ClustersetDNSClientBurst,
		Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return fmt.Errorf("--clusterset-dns-port: %w", err)
	}
	comps.Go("clusterset DNS", srv.Run)
	return nil
}

// startCoreDNSForward keeps the forwarding block in CoreDNS's Corefile
// (--coredns-forward), or, with the flag off, takes out the block an
// earlier run wrote in kube-system/coredns, where the agent may still
// read it.
func (a *Agent) startCoreDNSForward(comps *components) error {
	cm, _ := coreDNSConfigMap(a.cfg.CoreDNSForward) // checked in New
	if cm.Name == "" {
		comps.Go("coredns forward removal", func(ctx context.Context) error {
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			removed, err := dnsforward.Remove(rctx, a.kube, defaultCoreDNS)
			cancel()
			switch {
			case err != nil:
				a.log.Warn("the agent's clusterset.local block in CoreDNS's Corefile not removed", "configmap", defaultCoreDNS.String(), "err", err)
			case removed:
				a.log.Info("CoreDNS no longer forwards clusterset.local to the agent (--coredns-forward is off)", "configmap", defaultCoreDNS.String())
			}
			<-ctx.Done()
			return nil
		})
		return nil
	}
	k, err := dnsforward.New(dnsforward.Config{
		Client: a.kube, Corefile: cm,
		Service: types.NamespacedName{Namespace: a.agentNamespace(), Name: ClustersetDNSService},
		Logger:  a.log, Metrics: a.registry,
	})
	if err != nil {
		return fmt.Errorf("--coredns-forward: %w", err)
	}
	// The views of peers' networks: reverse lookups of the headless
	// endpoints there go to the agent's DNS too.
	a.fabric.notifyViews(k.SetReverse)
	comps.Go("coredns forward", k.Run)
	return nil
}
