package deploy

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload/dnsforward"
	"github.com/flotilla-io/flotilla/test/harness"
)

const kubeadmCorefile = `.:53 {
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
    cache 30
    reload
}
`

// deploy/coredns-forward: with its Role and policy the agent's own token
// writes and removes its block in CoreDNS's Corefile, and is refused
// anything else there: a change outside its block, a block that does more
// than forward clusterset.local, another key; deleting the ConfigMap is
// not in its Role.
func TestCoreDNSForwardFence(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	for _, dir := range []string{".", "coredns-forward"} {
		if out, err := kubectl(cp, "apply", "--server-side", "-k", dir); err != nil {
			t.Fatalf("kubectl apply -k %s: %v\n%s", dir, err, out)
		}
	}
	checkPoliciesCompile(t, cp)
	ctx := t.Context()
	if _, err := cp.Client.CoreV1().ConfigMaps("kube-system").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system"},
		Data:       map[string]string{dnsforward.CorefileKey: kubeadmCorefile, "other": "kept"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agent := kubernetes.NewForConfigOrDie(agentConfig(t, cp))
	write := func(data map[string]string) error {
		cm, err := agent.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			return err
		}
		ac := corev1ac.ConfigMap("coredns", "kube-system").WithResourceVersion(cm.ResourceVersion).WithData(data)
		_, err = agent.CoreV1().ConfigMaps("kube-system").Apply(ctx, ac, metav1.ApplyOptions{FieldManager: dnsforward.FieldManager, Force: true})
		return err
	}
	refused := func(what string, err error) {
		t.Helper()
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "flotilla-agent-coredns-forward") {
			t.Errorf("%s: %v, want refused by flotilla-agent-coredns-forward", what, err)
		}
	}
	block := dnsforward.Block(netip.MustParseAddr("10.96.0.53"), nil)
	withBlock, err := dnsforward.WithBlock(kubeadmCorefile, block)
	if err != nil {
		t.Fatal(err)
	}
	// The witness that the policy is loaded: a change outside the block
	// refused (the API server loads policies in the background).
	// Each try changes the Corefile anew: one let through before the
	// policy was loaded makes the next a change too.
	try := 0
	eventually.Within(t, 30*time.Second, "policy flotilla-agent-coredns-forward enforced", func() error {
		try++
		outside := strings.Replace(kubeadmCorefile, "cache 30", fmt.Sprintf("cache %d", 300+try), 1)
		err := write(map[string]string{dnsforward.CorefileKey: outside})
		if err == nil || !strings.Contains(err.Error(), "flotilla-agent-coredns-forward") {
			return fmt.Errorf("change outside the block: %v", err)
		}
		return nil
	})
	// The Corefile as it was, whatever got through before.
	cm, err := cp.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[dnsforward.CorefileKey] = kubeadmCorefile
	if _, err := cp.Client.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The block with the reverse zones of peers' views, then without.
	withReverse, err := dnsforward.WithBlock(kubeadmCorefile, dnsforward.Block(netip.MustParseAddr("10.96.0.53"),
		[]netip.Prefix{netip.MustParsePrefix("10.70.0.0/16"), netip.MustParsePrefix("10.71.0.0/20")}))
	if err != nil {
		t.Fatal(err)
	}
	if err := write(map[string]string{dnsforward.CorefileKey: withReverse}); err != nil {
		t.Fatalf("the agent writing its block with reverse zones: %v", err)
	}
	if err := write(map[string]string{dnsforward.CorefileKey: withBlock}); err != nil {
		t.Fatalf("the agent writing its block: %v", err)
	}
	for _, r := range []struct {
		what string
		data map[string]string
	}{
		{"a change outside the block", map[string]string{dnsforward.CorefileKey: strings.Replace(withBlock, "cache 30", "cache 300", 1)}},
		{"a block that forwards cluster.local too", map[string]string{dnsforward.CorefileKey: strings.Replace(withBlock, "clusterset.local:53 {", "cluster.local:53 {", 1)}},
		{"a block with a plugin more", map[string]string{dnsforward.CorefileKey: strings.Replace(withBlock, "    errors\n", "    errors\n    rewrite name regex (.*) evil.example\n", 1)}},
		{"a block that keeps denials longer", map[string]string{dnsforward.CorefileKey: strings.Replace(withBlock, "denial 9984 1\n", "denial 9984 3600\n", 1)}},
		{"a reverse block for a name", map[string]string{dnsforward.CorefileKey: strings.Replace(withReverse, "10.70.0.0/16:53 10.71.0.0/20:53 {", "cluster.local:53 {", 1)}},
		{"a reverse block with a plugin more", map[string]string{dnsforward.CorefileKey: strings.Replace(withReverse, "10.71.0.0/20:53 {\n    errors\n", "10.71.0.0/20:53 {\n    errors\n    rewrite name regex (.*) evil.example\n", 1)}},
		{"a second begin marker", map[string]string{dnsforward.CorefileKey: withBlock + "\n" + block}},
		{"another key", map[string]string{dnsforward.CorefileKey: withBlock, "other": "changed"}},
	} {
		refused(r.what, write(r.data))
	}
	// RBAC refuses it first (the Role has no delete).
	if err := agent.CoreV1().ConfigMaps("kube-system").Delete(ctx, "coredns", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("deleting CoreDNS's ConfigMap: %v, want Forbidden", err)
	}

	if err := write(map[string]string{dnsforward.CorefileKey: kubeadmCorefile}); err != nil {
		t.Fatalf("the agent removing its block: %v", err)
	}
	cm, err = cp.Client.CoreV1().ConfigMaps("kube-system").Get(context.Background(), "coredns", metav1.GetOptions{})
	if err != nil || cm.Data[dnsforward.CorefileKey] != kubeadmCorefile || cm.Data["other"] != "kept" {
		t.Errorf("CoreDNS's ConfigMap after the refusals and the removal: %v %q", err, cm.Data)
	}
}

// Without deploy/coredns-forward's policy, a Keeper run with the agent's
// own token and the Role's rights writes nothing in CoreDNS's Corefile and
// says why; once the policy is installed it proves the fence and writes
// its block.
func TestCoreDNSForwardFailsClosed(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	for _, args := range [][]string{{"-k", "."}, {"-f", "coredns-forward/rbac.yaml"}} {
		if out, err := kubectl(cp, append([]string{"apply", "--server-side"}, args...)...); err != nil {
			t.Fatalf("kubectl apply %v: %v\n%s", args, err, out)
		}
	}
	ctx := t.Context()
	if _, err := cp.Client.CoreV1().ConfigMaps("kube-system").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system"},
		Data:       map[string]string{dnsforward.CorefileKey: kubeadmCorefile},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k, err := dnsforward.New(dnsforward.Config{
		Client:   kubernetes.NewForConfigOrDie(agentConfig(t, cp)),
		Corefile: types.NamespacedName{Namespace: "kube-system", Name: "coredns"},
		Service:  types.NamespacedName{Namespace: "flotilla-system", Name: "flotilla-clusterset-dns"},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- k.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	corefile := func() string {
		t.Helper()
		cm, err := cp.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data[dnsforward.CorefileKey]
	}
	// The witness that the Keeper got as far as writing: its dry run
	// found the fence missing.
	eventually.Within(t, 30*time.Second, "the Keeper finding the fence missing", func() error {
		if err := k.Fence(); err == nil || !strings.Contains(err.Error(), "not enforced") {
			return fmt.Errorf("fence verdict %v", err)
		}
		return nil
	})
	if got := corefile(); got != kubeadmCorefile {
		t.Fatalf("the Keeper wrote CoreDNS's Corefile without its fence:\n%s", got)
	}

	if out, err := kubectl(cp, "apply", "--server-side", "-f", "coredns-forward/admission.yaml"); err != nil {
		t.Fatalf("kubectl apply coredns-forward/admission.yaml: %v\n%s", err, out)
	}
	eventually.Within(t, 90*time.Second, "the block written once the fence is proven", func() error {
		if got := corefile(); !strings.Contains(got, "clusterset.local:53") {
			return fmt.Errorf("Corefile without the block (fence: %v)", k.Fence())
		}
		return nil
	})
	if err := k.Fence(); err != nil {
		t.Errorf("fence after the block was written: %v", err)
	}
}
