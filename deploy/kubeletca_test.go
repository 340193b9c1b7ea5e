package deploy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/internal/eventually"
	offloadgrant "github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/kubeletapi"
	"github.com/flotilla-io/flotilla/test/harness"
)

// noCredentials: no provider granted anything; the kubelet API serves
// all the same.
type noCredentials struct{}

func (noCredentials) Credential(provider string) (*rest.Config, offloadgrant.Grant, error) {
	return nil, offloadgrant.Grant{}, errors.New("no grant")
}

// The virtual nodes' kubelet API, run with the agent's own token, makes
// its CA Secret and serves; started again (an agent restart), it reads
// the Secret back and leaves it as it was.
func testKubeletCAAsAgent(t *testing.T, cp *harness.ControlPlane, agent kubernetes.Interface) {
	ctx := t.Context()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	var logs lockedBuffer
	run := func() {
		t.Helper()
		api, err := kubeletapi.NewServer(kubeletapi.Config{
			Client: agent, Credentials: noCredentials{}, Address: netip.MustParseAddr("127.0.0.1"), Port: port, AgentNamespace: namespace,
			Logger: slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testLog{t}), &slog.HandlerOptions{Level: slog.LevelDebug})),
		})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- api.Run(runCtx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("the kubelet API, run as the agent: %v", err)
			}
		}()
		eventually.Within(t, 60*time.Second, "the kubelet API serving", api.Ready)
	}
	run()
	first, err := cp.Client.CoreV1().Secrets(namespace).Get(ctx, kubeletapi.CASecret, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the CA Secret: %v", err)
	}
	run()
	again, err := cp.Client.CoreV1().Secrets(namespace).Get(ctx, kubeletapi.CASecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if again.ResourceVersion != first.ResourceVersion {
		t.Errorf("the CA Secret was written again by a restarted kubelet API (resourceVersion %s, was %s)", again.ResourceVersion, first.ResourceVersion)
	}
	if strings.Contains(strings.ToLower(logs.String()), "forbidden") {
		t.Errorf("the kubelet API was refused something:\n%s", logs.String())
	}
}
