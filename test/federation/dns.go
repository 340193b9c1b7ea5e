package federation

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/test/harness"
)

// ClustersetDNSService is deploy/'s Service in front of the agent's
// clusterset.local DNS server.
const ClustersetDNSService = "flotilla-clusterset-dns"

// ForwardClusterset adds to c's CoreDNS the server block docs/services.md
// tells an operator to add by hand: clusterset.local forwarded to the
// agent's DNS Service. Then it restarts CoreDNS and waits for the new pod,
// as docs/services.md says to for the block to count at once: a running
// pod sees a changed ConfigMap only when the kubelet next syncs it, up to
// a minute later, where a new pod reads it when it starts.
func (c *NodeCluster) ForwardClusterset(t harness.TB) {
	t.Helper()
	ctx := context.Background()
	svc, err := c.CP.Client.CoreV1().Services(AgentNamespace).Get(ctx, ClustersetDNSService, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s: the agent's DNS Service: %v", c.Name, err)
	}
	cms := c.CP.Client.CoreV1().ConfigMaps(harness.DNSNamespace)
	cm, err := cms.Get(ctx, harness.DNSConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s: CoreDNS's ConfigMap: %v", c.Name, err)
	}
	block := fmt.Sprintf("clusterset.local:53 {\n    errors\n    cache 5 {\n        denial 9984 1\n    }\n    forward . %s:53\n}\n", svc.Spec.ClusterIP)
	if strings.Contains(cm.Data["Corefile"], block) {
		return
	}
	cm.Data["Corefile"] += "\n" + block
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("%s: forward clusterset.local in CoreDNS's Corefile: %v", c.Name, err)
	}
	deploy := "deployment/" + harness.DNSDeployment
	if out, err := Kubectl(c.CP, "-n", harness.DNSNamespace, "rollout", "restart", deploy); err != nil {
		t.Fatalf("%s: restart CoreDNS: %v: %s", c.Name, err, out)
	}
	if out, err := KubectlTimeout(c.CP, 2*time.Minute, "-n", harness.DNSNamespace, "rollout", "status", deploy, "--timeout", "90s"); err != nil {
		t.Fatalf("%s: CoreDNS restarted with the block: %v: %s", c.Name, err, out)
	}
}
