package harness

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

//go:embed kube-network-policies-version
var networkPolicyVersionFile string

// NetworkPolicyVersion is the pinned sigs.k8s.io/kube-network-policies
// release the clusters with ControlPlaneOptions.NetworkPolicy run.
// hack/build-kube-network-policies.sh reads the same file.
var NetworkPolicyVersion = strings.TrimSpace(networkPolicyVersionFile)

// NetworkPolicyBinary is kube-network-policies of NetworkPolicyVersion
// as hack/build-kube-network-policies.sh builds it into the cache.
func NetworkPolicyBinary() string {
	return cachedBinary("kube-network-policies", NetworkPolicyVersion, "kube-network-policies")
}

// NetworkPolicyEnforcer is kube-network-policies, for the tests whose
// clusters must enforce NetworkPolicy.
var NetworkPolicyEnforcer = cachedRequirement("kube-network-policies "+NetworkPolicyVersion, NetworkPolicyBinary, "make kube-network-policies")

// networkPolicyUser is the API user every kube-network-policies of a
// cluster acts as, with the rights its own manifest gives its account.
const networkPolicyUser = "kube-network-policies"

// networkPolicyQueue is the nfqueue it reads the first packets of
// connections from (its default).
const networkPolicyQueue = 100

// installNetworkPolicyRights gives networkPolicyUser what upstream's
// install.yaml gives its ServiceAccount (once per control plane): read
// pods, namespaces, nodes and NetworkPolicies, write events.
func (cp *ControlPlane) installNetworkPolicyRights() error {
	cp.networkPolicyOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		rbac := cp.Client.RbacV1()
		_, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: networkPolicyUser},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"pods", "namespaces", "nodes"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
			},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			cp.networkPolicyErr = fmt.Errorf("ClusterRole %s: %w", networkPolicyUser, err)
			return
		}
		_, err = rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: networkPolicyUser},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: networkPolicyUser},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: networkPolicyUser}},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			cp.networkPolicyErr = fmt.Errorf("ClusterRoleBinding %s: %w", networkPolicyUser, err)
		}
	})
	return cp.networkPolicyErr
}

// startNetworkPolicy runs kube-network-policies on the node, as its
// DaemonSet runs it (host network, fail closed: a packet it should judge
// is dropped while it does not run), and returns once it judges packets:
// its nftables table is in place and it reads the queue.
func (n *Node) startNetworkPolicy() error {
	if err := n.cp.installNetworkPolicyRights(); err != nil {
		return err
	}
	dir := filepath.Join(n.paths.dir, "kube-network-policies")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := n.cp.writeClientKubeconfig(kubeconfig, networkPolicyUser); err != nil {
		return err
	}
	var err error
	if n.NetworkPolicy, err = n.startNodeProcess("kube-network-policies", NetworkPolicyBinary(),
		"--kubeconfig", kubeconfig, "--hostname-override", n.NodeName,
		"--nfqueue-id", fmt.Sprint(networkPolicyQueue), "-v", "2"); err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if n.networkPolicyReady() {
			return nil
		}
		if exited, _ := n.NetworkPolicy.Exited(); exited {
			return fmt.Errorf("kube-network-policies on node %s: %w", n.NodeName, n.NetworkPolicy.exitError())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-network-policies on node %s neither made its table nor bound queue %d in 60 s; last lines of its log (%s):\n%s",
				n.NodeName, networkPolicyQueue, n.NetworkPolicy.LogPath, n.NetworkPolicy.Tail(15))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// networkPolicyReady says whether the node's kube-network-policies has
// its nftables table and reads its queue (the node's
// /proc/net/netfilter/nfnetlink_queue lists the queues read in its
// network namespace).
func (n *Node) networkPolicyReady() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	queues, err := n.Exec(ctx, "cat", "/proc/net/netfilter/nfnetlink_queue")
	if err != nil {
		return false
	}
	read := false
	for _, line := range strings.Split(string(queues), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == fmt.Sprint(networkPolicyQueue) {
			read = true
		}
	}
	if !read {
		return false
	}
	_, err = n.Exec(ctx, "nft", "list", "table", "inet", "kube-network-policies")
	return err == nil
}
