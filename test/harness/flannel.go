package harness

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

//go:embed flannel-version
var flannelVersionFile string

// FlannelVersion is the pinned flannel release the clusters with
// ControlPlaneOptions.Flannel run. hack/build-flannel.sh reads the same
// file.
var FlannelVersion = strings.TrimSpace(flannelVersionFile)

// FlannelBinary is flanneld of FlannelVersion as hack/build-flannel.sh
// builds it into the cache.
func FlannelBinary() string { return cachedBinary("flannel", FlannelVersion, "flanneld") }

// Flannel is flanneld, for the tests whose clusters run it as their CNI.
var Flannel = cachedRequirement("flannel "+FlannelVersion, FlannelBinary, "make flannel")

// flannelUser is the API user every flanneld of a cluster acts as, with
// the rights flannel's own manifest gives its ServiceAccount.
const flannelUser = "flannel"

// flannelSubnet is what flanneld wrote into its subnet file: the cluster's
// network, the node's slice with the slice's gateway address, and the MTU
// of pods' interfaces (the node's less the VXLAN header).
type flannelSubnet struct {
	Network netip.Prefix
	Subnet  netip.Prefix // the gateway's address and the slice's length
	MTU     int
}

// parseFlannelSubnet reads flanneld's subnet file (FLANNEL_NETWORK=...,
// one variable a line).
func parseFlannelSubnet(b []byte) (flannelSubnet, error) {
	var s flannelSubnet
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok {
			vars[k] = v
		}
	}
	var err error
	if s.Network, err = netip.ParsePrefix(vars["FLANNEL_NETWORK"]); err != nil {
		return s, fmt.Errorf("FLANNEL_NETWORK: %w", err)
	}
	if s.Subnet, err = netip.ParsePrefix(vars["FLANNEL_SUBNET"]); err != nil {
		return s, fmt.Errorf("FLANNEL_SUBNET: %w", err)
	}
	if s.MTU, err = strconv.Atoi(vars["FLANNEL_MTU"]); err != nil || s.MTU < 576 {
		return s, fmt.Errorf("FLANNEL_MTU %q: not an MTU", vars["FLANNEL_MTU"])
	}
	return s, nil
}

// installFlannelRights gives flannelUser what flannel's manifest gives its
// account (once per control plane): read nodes and pods, patch a node's
// status (NetworkUnavailable) and its annotations (the node's VTEP).
func (cp *ControlPlane) installFlannelRights() error {
	cp.flannelOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		rbac := cp.Client.RbacV1()
		_, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: flannelUser},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
				{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
				{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
			},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			cp.flannelErr = fmt.Errorf("ClusterRole %s: %w", flannelUser, err)
			return
		}
		_, err = rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: flannelUser},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: flannelUser},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: flannelUser}},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			cp.flannelErr = fmt.Errorf("ClusterRoleBinding %s: %w", flannelUser, err)
		}
	})
	return cp.flannelErr
}

// startFlannel runs flanneld on the node, as flannel's DaemonSet runs it:
// the Kubernetes subnet manager (the node's slice is its spec.podCIDR),
// the vxlan backend on eth0 and flannel's own masquerade (--ip-masq,
// iptables). It returns the node's CNI network, written from the subnet
// file flanneld writes once its backend is up, as flannel's CNI plugin
// delegates it to the bridge and host-local plugins: the slice and its
// gateway, flannel's MTU, a route to the cluster's network and the
// default route, and no masquerade of the bridge's own (flanneld's rules
// do it).
func (n *Node) startFlannel() ([]byte, error) {
	cp := n.cp
	if err := cp.installFlannelRights(); err != nil {
		return nil, err
	}
	dir := filepath.Join(n.paths.dir, "flannel")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.writeClientKubeconfig(kubeconfig, flannelUser); err != nil {
		return nil, err
	}
	netConf, err := json.Marshal(map[string]any{
		"Network": cp.Options.PodCIDR.String(),
		"Backend": map[string]string{"Type": "vxlan"},
	})
	if err != nil {
		return nil, err
	}
	netConfPath := filepath.Join(dir, "net-conf.json")
	if err := os.WriteFile(netConfPath, netConf, 0o644); err != nil {
		return nil, err
	}
	subnetFile := filepath.Join(dir, "subnet.env")
	if n.Flannel, err = n.startNodeProcess("flanneld", "env", "NODE_NAME="+n.NodeName, FlannelBinary(),
		"--kube-subnet-mgr", "--kubeconfig-file", kubeconfig, "--net-config-path", netConfPath,
		"--iface", "eth0", "--ip-masq", "--subnet-file", subnetFile); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, err := os.ReadFile(subnetFile)
		if err == nil {
			s, err := parseFlannelSubnet(b)
			if err != nil {
				return nil, fmt.Errorf("flanneld's subnet file %s: %w", subnetFile, err)
			}
			if s.Subnet.Masked() != n.PodCIDR {
				return nil, fmt.Errorf("flanneld on node %s took %s, not the node's pod range %s", n.NodeName, s.Subnet, n.PodCIDR)
			}
			// What flannel's CNI plugin hands the bridge plugin.
			return cniConfig(n.paths, n.cgroup, bridgeNetwork{
				Slice: n.PodCIDR, Gateway: s.Subnet.Addr(), MTU: s.MTU,
				Routes: []netip.Prefix{s.Network, defaultRoute},
			})
		}
		if exited, _ := n.Flannel.Exited(); exited {
			return nil, fmt.Errorf("flanneld on node %s: %w\n%s", n.NodeName, n.Flannel.exitError(), n.Flannel.Tail(15))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("flanneld on node %s wrote no subnet file in 60 s; last lines of its log (%s):\n%s", n.NodeName, n.Flannel.LogPath, n.Flannel.Tail(15))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
