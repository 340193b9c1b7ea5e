package deploy

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/test/harness"
)

// testLedgerSnapshot: with its own token and the fences in force, the
// agent writes its ledger's snapshot into the Secret flotilla-ledger and
// a replica with an empty state directory restores it; every other
// Secret of its namespace it may not write, nor read that one elsewhere.
func testLedgerSnapshot(t *testing.T, cp *harness.ControlPlane) {
	ctx := t.Context()
	kube := kubernetes.NewForConfigOrDie(agentConfig(t, cp))
	waitAgentFencesEnforced(t, cp, kube)
	t.Cleanup(func() {
		cp.Client.CoreV1().Secrets(namespace).Delete(context.Background(), ha.SecretName, metav1.DeleteOptions{})
	})
	snaps := &ha.Snapshots{Kube: kube, Namespace: namespace, Log: slog.Default()}
	open := func() *ipam.Ledger {
		l, err := ipam.Open(filepath.Join(t.TempDir(), ipam.FileName), ipam.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	active := open()
	if err := active.PutKey("identity", []byte("seed")); err != nil {
		t.Fatal(err)
	}
	if err := snaps.Write(ctx, active); err != nil {
		t.Fatalf("agent creates its ledger's snapshot: %v", err)
	}
	if err := active.PutKey("wireguard", []byte("key")); err != nil {
		t.Fatal(err)
	}
	if err := snaps.Write(ctx, active); err != nil {
		t.Fatalf("agent updates its ledger's snapshot: %v", err)
	}
	if gen, err := snaps.Restore(ctx, open(), "identity"); err != nil || gen != active.Generation() {
		t.Fatalf("agent restores its ledger's snapshot: %d, %v; want generation %d", gen, err, active.Generation())
	}
	// A standby follows the Secret by name (list and watch), with the
	// same token.
	standbyPath := filepath.Join(t.TempDir(), ipam.FileName)
	var followed bytes.Buffer
	followCtx, stopFollowing := context.WithTimeout(ctx, 30*time.Second)
	(&ha.Snapshots{Kube: kube, Namespace: namespace, Log: slog.New(slog.NewTextHandler(&followed, nil))}).Follow(followCtx,
		func() (*ipam.Ledger, error) {
			defer stopFollowing() // once the first restore is under way
			return ipam.Open(standbyPath, ipam.Options{})
		}, "identity")
	stopFollowing()
	if want := fmt.Sprintf("generation=%d", active.Generation()); !strings.Contains(followed.String(), want) {
		t.Fatalf("a standby with the agent's token did not restore the snapshot (%s):\n%s", want, followed.String())
	}

	other := func(ns, name string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: map[string][]byte{"k": []byte("v")}}
	}
	victim, err := cp.Client.CoreV1().Secrets("default").Create(ctx, other("default", "victim"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cp.Client.CoreV1().Secrets("default").Delete(context.Background(), victim.Name, metav1.DeleteOptions{})
	})
	// RBAC lets it create Secrets anywhere; the policy that keeps it to
	// tenants and the names above is loaded in the background.
	eventually.Within(t, 30*time.Second, "policy flotilla-agent-tenant-objects enforced", func() error {
		_, err := kube.CoreV1().Secrets(namespace).Create(ctx, other(namespace, "flotilla-witness"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !containsPolicy(err, "flotilla-agent-tenant-objects") {
			return fmt.Errorf("dry-run create of Secret flotilla-witness: %v", err)
		}
		return nil
	})
	for _, r := range []struct {
		what string
		do   func() error
	}{
		{"create another Secret in its namespace", func() error {
			_, err := kube.CoreV1().Secrets(namespace).Create(ctx, other(namespace, "flotilla-ledger-2"), metav1.CreateOptions{})
			return err
		}},
		{"create flotilla-ledger in default", func() error {
			_, err := kube.CoreV1().Secrets("default").Create(ctx, other("default", ha.SecretName), metav1.CreateOptions{})
			return err
		}},
		{"patch a Secret of default", func() error {
			_, err := kube.CoreV1().Secrets("default").Patch(ctx, victim.Name, types.MergePatchType, []byte(`{"data":{"k":"dg=="}}`), metav1.PatchOptions{})
			return err
		}},
		{"read flotilla-ledger in default", func() error {
			_, err := kube.CoreV1().Secrets("default").Get(ctx, ha.SecretName, metav1.GetOptions{})
			return err
		}},
		{"list the Secrets of its namespace", func() error {
			_, err := kube.CoreV1().Secrets(namespace).List(ctx, metav1.ListOptions{})
			return err
		}},
	} {
		if err := r.do(); !apierrors.IsForbidden(err) {
			t.Errorf("agent may %s: got %v, want Forbidden", r.what, err)
		}
	}
}
