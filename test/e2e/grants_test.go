package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/remote"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// testGrants runs on a federation of two real clusters whose agents run
// as pods under their own accounts (TestAgentPodFromManifests): prov
// grants cons offloading from the command line, cons holds a credential
// that works against prov's API server across the LAN, and revoking it
// makes the grant's tokens get 401 and cons say so. No credential shows
// in any log, event or status.
func testGrants(t *testing.T, prov, cons *federation.NodeCluster) {
	consID := peerID(t, prov, cons.Name)
	tenant := offload.TenantNamespace(consID)

	t.Run("manual policy: nothing on the provider until Grant", func(t *testing.T) {
		// The witness that the provider looked: its Peer says NotGranted.
		waitCondition(t, prov, cons.Name, v1alpha1.ConditionOffloadGranted, "NotGranted", 30*time.Second)
		nss, err := prov.CP.Client.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{LabelSelector: offload.LabelTenant})
		if err != nil || len(nss.Items) != 0 {
			t.Errorf("tenant namespaces on %s before any grant: %d (err %v)", prov.Name, len(nss.Items), err)
		}
		if c := condition(t, cons, prov.Name, v1alpha1.ConditionOffloadCredential); c != nil {
			t.Errorf("%s shows a credential from %s before any grant: %s %s", cons.Name, prov.Name, c.Reason, c.Message)
		}
	})

	t.Run("flotilla grant gives the consumer a working credential", func(t *testing.T) {
		out, err := flotillaCLI(t, prov, "grant", cons.Name, "--cpu", "2", "--memory", "4Gi", "--pods", "20", "--namespaces", "3")
		if err != nil || !strings.Contains(out, "Granted: tenant namespace "+tenant) {
			t.Fatalf("flotilla grant %s on %s: %v\n%s", cons.Name, prov.Name, err, out)
		}
		// The consumer holds the grant but does not use it until its
		// admin accepts: the witness that the grant arrived.
		waiting := waitCondition(t, cons, prov.Name, v1alpha1.ConditionOffloadCredential, remote.ReasonAwaitingOptIn, 30*time.Second)
		if waiting.Status != metav1.ConditionFalse || !strings.Contains(waiting.Message, "offloadTo") {
			t.Errorf("%s's credential from %s before the opt-in: %s %s %s", cons.Name, prov.Name, waiting.Status, waiting.Reason, waiting.Message)
		}
		if got := peerNamed(t, cons, prov.Name).Status.Offloading; got != nil && got.Received != nil {
			t.Errorf("%s shows a credential received from %s before its admin accepted: %+v", cons.Name, prov.Name, got.Received)
		}
		if n := virtualNodes(t, cons); n != 0 {
			t.Errorf("%s has %d virtual nodes before its admin accepted offloading", cons.Name, n)
		}
		acceptOffloading(t, cons, prov.Name)
		c := waitCondition(t, cons, prov.Name, v1alpha1.ConditionOffloadCredential, "Ready", 30*time.Second)
		if c.Status != metav1.ConditionTrue {
			t.Errorf("%s's credential from %s: %s %s", cons.Name, prov.Name, c.Reason, c.Message)
		}
		p := peerNamed(t, cons, prov.Name)
		got := p.Status.Offloading
		if got == nil || got.Received == nil || got.Received.Namespace != tenant || got.Received.Expires == nil ||
			got.Received.Limits == nil || got.Received.Limits.Pods == nil || *got.Received.Limits.Pods != 20 {
			t.Errorf("%s's status.offloading for %s: %+v, want namespace %s, limits with 20 pods, an expiry", cons.Name, prov.Name, got, tenant)
		} else if left := time.Until(got.Received.Expires.Time); left < 50*time.Minute || left > 61*time.Minute {
			t.Errorf("the credential expires in %s, want about an hour", left)
		}
		q, err := prov.CP.Client.CoreV1().ResourceQuotas(tenant).Get(context.Background(), offload.GrantSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("quota of %s on %s: %v", tenant, prov.Name, err)
		}
		if pods := q.Spec.Hard["pods"]; pods.Value() != 20 {
			t.Errorf("quota of %s: pods %s, want 20", tenant, pods.String())
		}
		if ps := peerNamed(t, prov, cons.Name).Status.Offloading; ps == nil || ps.Granted == nil || ps.Granted.Namespace != tenant {
			t.Errorf("%s's status.offloading for %s: %+v, want granted in %s", prov.Name, cons.Name, ps, tenant)
		}
	})

	t.Run("without its admission policies the provider holds the credential back and says why", func(t *testing.T) {
		ctx := context.Background()
		const policy = "flotilla-agent-tenant-objects"
		bindings := prov.CP.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
		binding, err := bindings.Get(ctx, policy, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		binding.ResourceVersion, binding.UID, binding.ManagedFields = "", "", nil
		restore := func() error {
			if _, err := bindings.Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
			return nil
		}
		t.Cleanup(func() {
			if err := restore(); err != nil {
				t.Errorf("put back the binding %s on %s: %v", policy, prov.Name, err)
			}
		})
		// The witness that it was granting: the previous subtest's grant.
		waitCondition(t, prov, cons.Name, v1alpha1.ConditionOffloadGranted, "Granted", 30*time.Second)
		if err := bindings.Delete(ctx, policy, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		c := waitCondition(t, prov, cons.Name, v1alpha1.ConditionOffloadGranted, v1alpha1.ReasonFencesNotEnforced, 30*time.Second)
		if !strings.Contains(c.Message, policy) {
			t.Errorf("%s's Peer %s does not name the missing policy: %s", prov.Name, cons.Name, c.Message)
		}
		eventually.Within(t, 30*time.Second, "the agent's /readyz naming the fences", func() error {
			body, status, err := agentGet(prov, "/readyz?verbose")
			if err != nil {
				return err
			}
			if status != http.StatusServiceUnavailable || !strings.Contains(body, "[-]fences failed") || !strings.Contains(body, policy) {
				return fmt.Errorf("%d %s", status, body)
			}
			return nil
		})

		if err := restore(); err != nil {
			t.Fatal(err)
		}
		waitCondition(t, prov, cons.Name, v1alpha1.ConditionOffloadGranted, "Granted", 60*time.Second)
		waitCondition(t, cons, prov.Name, v1alpha1.ConditionOffloadCredential, "Ready", 30*time.Second)
		eventually.Within(t, 30*time.Second, "the agent ready again", func() error {
			body, status, err := agentGet(prov, "/readyz")
			if err == nil && status != http.StatusOK {
				err = fmt.Errorf("%d %s", status, body)
			}
			return err
		})
	})

	t.Run("flotilla revoke: the consumer's credential gets 401 and the consumer says Revoked", func(t *testing.T) {
		provID := peerID(t, cons, prov.Name)
		// The credential cons's agent holds, as it was delivered: from its
		// ledger, opened with its own identity.
		held := heldCredential(t, cons, provID)
		// Reached at the address the test can dial, checked against the
		// CA the grant carried.
		cfg := &rest.Config{Host: "https://" + prov.CP.Addr.String(), BearerToken: held.Token.Reveal(),
			TLSClientConfig: rest.TLSClientConfig{CAData: held.CAData}}
		if user, err := whoIs(cfg); err != nil || user != offload.ConsumerUser(consID) {
			t.Fatalf("%s's credential from %s before revoke: user %q (err %v), want %s", cons.Name, prov.Name, user, err, offload.ConsumerUser(consID))
		}
		out, err := flotillaCLI(t, prov, "revoke", cons.Name)
		start := time.Now()
		if err != nil || !strings.Contains(out, "Denied") {
			t.Fatalf("flotilla revoke %s on %s: %v\n%s", cons.Name, prov.Name, err, out)
		}
		deadline := time.Now().Add(10 * time.Second)
		for err := whoAmI(cfg); !apierrors.IsUnauthorized(err); err = whoAmI(cfg) {
			if time.Now().After(deadline) {
				t.Fatalf("%s's credential from %s 10 s after revoke: %v, want 401", cons.Name, prov.Name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("401 %s after flotilla revoke returned", time.Since(start).Round(time.Millisecond))
		waitCondition(t, cons, prov.Name, v1alpha1.ConditionOffloadCredential, "Revoked", 30*time.Second)
		if g, ok := credentialIn(t, cons, provID); ok {
			t.Errorf("%s's ledger still holds a credential from %s after revoke (serial %d, was %d)", cons.Name, prov.Name, g.Serial, held.Serial)
		}
		deadline = time.Now().Add(60 * time.Second)
		for {
			_, err := prov.CP.Client.CoreV1().Namespaces().Get(context.Background(), tenant, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("tenant namespace %s still on %s 60 s after revoke (err %v)", tenant, prov.Name, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	t.Run("no credential in any log, event, status or metric", func(t *testing.T) {
		// Every token the API server issues is a JWT: its header starts so.
		const jwt = "eyJhbGciOi"
		for _, c := range []*federation.NodeCluster{prov, cons} {
			for what, args := range map[string][]string{
				"agent log": {"-n", federation.AgentNamespace, "logs", "deployment/flotilla-agent"},
				"events":    {"get", "events", "-A", "-o", "json"},
				"Peers":     {"get", "peers", "-o", "json"},
			} {
				out := mustKubectl(t, c.CP, args...)
				if strings.Contains(out, jwt) {
					t.Errorf("%s of %s holds a token", what, c.Name)
				}
			}
			metrics := agentMetrics(t, c)
			if !strings.Contains(metrics, "flotilla_grant_") {
				t.Errorf("the metrics of %s's agent have no flotilla_grant_ series: not the agent's", c.Name)
			}
			if strings.Contains(metrics, jwt) {
				t.Errorf("the metrics of %s's agent hold a token", c.Name)
			}
		}
	})
}

// agentMetrics scrapes the agent's /metrics from its gateway node's
// network, which the agent's pod shares.
func agentMetrics(t *testing.T, c *federation.NodeCluster) string {
	t.Helper()
	body, status, err := agentGet(c, "/metrics")
	if err != nil || status != http.StatusOK {
		t.Fatalf("metrics of %s's agent: %d %v", c.Name, status, err)
	}
	return body
}

// agentGet reads path from the agent's metrics port, from its gateway
// node's network, with a token of deploy/'s flotilla-viewer (the
// loopback is trusted no more than any other address).
func agentGet(c *federation.NodeCluster, path string) (body string, status int, err error) {
	return agentGetOn(c, c.Gateway, path)
}

// agentGetOn is agentGet for the agent replica on node.
func agentGetOn(c *federation.NodeCluster, node *harness.Node, path string) (body string, status int, err error) {
	return getOn(c, node, agentMetricsPort, path)
}

// fabricMetrics scrapes the /metrics of the fabric's pod on node, as
// agentMetrics does the agent's.
func fabricMetrics(t *testing.T, c *federation.NodeCluster, node *harness.Node) string {
	t.Helper()
	body, status, err := getOn(c, node, fabricapi.MetricsPort, "/metrics")
	if err != nil || status != http.StatusOK {
		t.Fatalf("metrics of the fabric on %s's node %s: %d %v", c.Name, node.NodeName, status, err)
	}
	return body
}

const agentMetricsPort = 9470

// getOn reads path from port on node's network, with a token of
// deploy/'s flotilla-viewer.
func getOn(c *federation.NodeCluster, node *harness.Node, port int, path string) (body string, status int, err error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return node.DialContext(ctx, network, addr)
		}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seconds := int64(600)
	tr, err := c.CP.Client.CoreV1().ServiceAccounts("flotilla-system").CreateToken(ctx, "flotilla-viewer",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		return "", 0, fmt.Errorf("a token of flotilla-system/flotilla-viewer: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), nil)
	if err != nil {
		return "", 0, err
	}
	req.Header.Set("Authorization", "Bearer "+tr.Status.Token)
	resp, err := hc.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode, err
}

// peerID is the name (the cluster ID) of c's Peer for the cluster named
// name.
func peerID(t *testing.T, c *federation.NodeCluster, name string) string {
	t.Helper()
	return peerNamed(t, c, name).Name
}

func peerNamed(t *testing.T, c *federation.NodeCluster, name string) v1alpha1.Peer {
	t.Helper()
	peers, err := c.Peers(context.Background())
	if err != nil {
		t.Fatalf("Peers of %s: %v", c.Name, err)
	}
	p, ok := peers[name]
	if !ok {
		t.Fatalf("%s has no Peer for %s", c.Name, name)
	}
	return p
}

// acceptOffloading is consumer's admin accepting offloading to provider
// (its Peer's spec.offloadTo) and taking each label key given from what
// the provider announces as the admin's own label of the Peer: a
// NamespaceOffload's selector matches only those.
func acceptOffloading(t *testing.T, consumer *federation.NodeCluster, provider string, keys ...string) {
	t.Helper()
	var p v1alpha1.Peer
	eventually.Within(t, 90*time.Second, consumer.Name+"'s Peer for "+provider+" announcing "+strings.Join(keys, ","), func() error {
		peers, err := consumer.Peers(context.Background())
		if err != nil {
			return err
		}
		var ok bool
		if p, ok = peers[provider]; !ok {
			return errors.New("no Peer yet")
		}
		for _, k := range keys {
			if _, ok := p.Status.AnnouncedLabels[k]; !ok {
				return fmt.Errorf("announced labels %v", p.Status.AnnouncedLabels)
			}
		}
		return nil
	})
	// The labels first: the virtual node made once the grant is
	// accepted carries them from the start.
	if len(keys) > 0 {
		args := []string{"label", "--overwrite", "peer", p.Name}
		for _, k := range keys {
			args = append(args, k+"="+p.Status.AnnouncedLabels[k])
		}
		mustKubectl(t, consumer.CP, args...)
	}
	mustKubectl(t, consumer.CP, "patch", "peer", p.Name, "--type=merge", "-p", `{"spec":{"offloadTo":"Accept"}}`)
}

// everyPeer selects every Peer: the label is the local agent's on each,
// not a peer's claim. The benchmarks' consumers run --offload-to=auto, so
// it selects every provider that granted them.
const everyPeer = v1alpha1.LabelManagedBy + "=" + v1alpha1.ManagedByValue

// everyPeerSelector is everyPeer as a clusterSelector.
func everyPeerSelector() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}}
}

// virtualNodes counts c's virtual nodes.
func virtualNodes(t *testing.T, c *federation.NodeCluster) int {
	t.Helper()
	nodes, err := c.CP.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{LabelSelector: v1alpha1.LabelVirtualNode + "=true"})
	if err != nil {
		t.Fatalf("Nodes of %s: %v", c.Name, err)
	}
	return len(nodes.Items)
}

func condition(t *testing.T, c *federation.NodeCluster, peer, kind string) *metav1.Condition {
	t.Helper()
	p := peerNamed(t, c, peer)
	return meta.FindStatusCondition(p.Status.Conditions, kind)
}

// flotillaCLI runs an operator command of the binary built from this
// checkout against c.
func flotillaCLI(t testing.TB, c *federation.NodeCluster, args ...string) (string, error) {
	args = append(args, "--kubeconfig", c.CP.Kubeconfig)
	out, err := exec.Command(harness.Flotilla(t), args...).CombinedOutput()
	return string(out), err
}

// whoAmI makes a request with cfg's credential.
func whoAmI(cfg *rest.Config) error {
	_, err := whoIs(cfg)
	return err
}

// whoIs is the user the API server of cfg authenticates its credential as.
func whoIs(cfg *rest.Config) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return r.Status.UserInfo.Username, nil
}

// heldCredential is the grant of provider that c's agent holds in its
// ledger; the test fails when there is none.
func heldCredential(t *testing.T, c *federation.NodeCluster, provider string) grant.Grant {
	t.Helper()
	g, ok := credentialIn(t, c, provider)
	if !ok {
		t.Fatalf("%s's ledger holds no credential from %s", c.Name, provider)
	}
	return g
}

// credentialIn reads the grant of provider held in c's ledger (a
// snapshot: the running agent holds the file), opened with c's identity
// from the same ledger, as the agent opens it when it starts.
func credentialIn(t *testing.T, c *federation.NodeCluster, provider string) (grant.Grant, bool) {
	t.Helper()
	l, err := ipam.OpenSnapshot(filepath.Join(c.StateDir, ipam.FileName))
	if err != nil {
		t.Fatalf("%s's ledger: %v", c.Name, err)
	}
	defer l.Close()
	seed, err := l.Key("identity")
	if err != nil {
		t.Fatalf("%s's identity in its ledger: %v", c.Name, err)
	}
	id, err := identity.FromSeed(seed)
	if err != nil {
		t.Fatalf("%s's identity in its ledger: %v", c.Name, err)
	}
	grants, problems, err := grant.NewStore(id, l).Load(time.Now())
	if err != nil || len(problems) > 0 {
		t.Fatalf("%s's grants in its ledger: %v %v", c.Name, problems, err)
	}
	for _, g := range grants {
		if g.Provider == provider {
			return g, true
		}
	}
	return grant.Grant{}, false
}
