package federation

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flotilla-io/flotilla/test/harness"
)

// agentAccountFiles are what deploy/ installs for the agent's account,
// the Deployment aside; and every admission*.yaml.
var agentAccountFiles = []string{"namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "reflection.yaml"}

// RunAsAgentAccount makes the cluster's agent process run as a pod of
// deploy/ would: deploy/'s account, RBAC and admission policies are
// applied, and the agent gets a token of flotilla-system/flotilla-agent
// instead of the administrator's credential. A provider grants nothing
// unless it proves the policies confine it, which they do only for that
// account. Call it before StartAgent.
func (c *Cluster) RunAsAgentAccount(t harness.TB) {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	deploy := filepath.Join(filepath.Dir(self), "..", "..", "deploy")
	args := []string{"apply", "--server-side"}
	for _, f := range agentAccountFiles {
		args = append(args, "-f", filepath.Join(deploy, f))
	}
	policies, err := filepath.Glob(filepath.Join(deploy, "admission*.yaml"))
	if err != nil || len(policies) == 0 {
		t.Fatalf("deploy/admission*.yaml: %v (%d files)", err, len(policies))
	}
	for _, f := range policies {
		args = append(args, "-f", f)
	}
	mustKubectl(t, c.CP, args...)
	// Longer than any test: the agent does not renew a kubeconfig's token.
	expiry := int64(24 * 3600)
	tr, err := c.CP.Client.CoreV1().ServiceAccounts(AgentNamespace).CreateToken(context.Background(), "flotilla-agent",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("%s: token for the agent's account: %v", c.Name, err)
	}
	cfg, err := clientcmd.LoadFromFile(c.CP.Kubeconfig)
	if err != nil {
		t.Fatalf("%v", err)
	}
	for _, a := range cfg.AuthInfos {
		a.ClientCertificate, a.ClientKey, a.ClientCertificateData, a.ClientKeyData = "", "", nil, nil
		a.Token, a.TokenFile = tr.Status.Token, ""
	}
	path := filepath.Join(filepath.Dir(c.StateDir), "agent-"+c.Name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatalf("%v", err)
	}
	i := slices.Index(c.Args, "--kubeconfig")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("%s: the agent's arguments name no --kubeconfig: %v", c.Name, c.Args)
	}
	c.Args[i+1] = path
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatalf("%v", err)
	}
}
