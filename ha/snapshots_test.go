package ha

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/test/harness"
)

const namespace = "flotilla-system"

// apiServer is a real control plane with the agent's namespace, one per
// test.
func apiServer(t *testing.T) kubernetes.Interface {
	t.Helper()
	harness.Require(t, harness.NeedsControlPlane...)
	cp := harness.New(t).ControlPlane("cp", harness.ControlPlaneOptions{})
	if _, err := cp.Client.CoreV1().Namespaces().Create(t.Context(), namespaceObject(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cp.Client
}

func namespaceObject() *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
}

// replica is one agent's ledger, in a state directory of its own.
func replica(t *testing.T) *ipam.Ledger {
	t.Helper()
	l, err := ipam.Open(filepath.Join(t.TempDir(), ipam.FileName), ipam.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func write(t *testing.T, l *ipam.Ledger, key, value string) {
	t.Helper()
	if err := l.PutKey(key, []byte(value)); err != nil {
		t.Fatal(err)
	}
}

func key(t *testing.T, l *ipam.Ledger, name string) string {
	t.Helper()
	v, err := l.Key(name)
	if err != nil {
		t.Fatalf("key %s: %v", name, err)
	}
	return string(v)
}

func views(l *ipam.Ledger) string {
	var out []string
	for _, v := range l.Views("") {
		out = append(out, v.Peer+" "+v.Remote.String()+" as "+v.View.String())
	}
	return strings.Join(out, ", ")
}

func secretGeneration(t *testing.T, kube kubernetes.Interface) uint64 {
	t.Helper()
	sec, err := kube.CoreV1().Secrets(namespace).Get(t.Context(), SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := ipam.DecodeSnapshot(sec.Data[SecretKey])
	if err != nil {
		t.Fatal(err)
	}
	return s.Generation
}

// The snapshot an active replica writes brings a replica with an empty
// state directory to the same identity, keys and views; and an older
// generation never overwrites a newer one, nor does a replica that did
// not restore what another wrote.
func TestSnapshotSecret(t *testing.T) {
	kube := apiServer(t)
	ctx := t.Context()
	snaps := &Snapshots{Kube: kube, Namespace: namespace, Log: slog.Default()}

	active := replica(t)
	write(t, active, "identity", "seed-a")
	write(t, active, "wireguard", "wg-a")
	if _, err := active.ViewOf("cpeer", netip.MustParsePrefix("10.0.0.0/16")); err != nil {
		t.Fatal(err)
	}
	if err := snaps.Write(ctx, active); err != nil {
		t.Fatal(err)
	}
	sec, err := kube.CoreV1().Secrets(namespace).Get(ctx, SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sec.Labels["app.kubernetes.io/managed-by"] != "flotilla" || sec.Annotations[GenerationAnnotation] != fmt.Sprint(active.Generation()) {
		t.Fatalf("Secret labels %v annotations %v", sec.Labels, sec.Annotations)
	}

	t.Run("restore into an empty state directory", func(t *testing.T) {
		standby := replica(t)
		gen, err := snaps.Restore(ctx, standby, "identity")
		if err != nil || gen != active.Generation() {
			t.Fatalf("Restore = %d, %v; want generation %d", gen, err, active.Generation())
		}
		if key(t, standby, "identity") != "seed-a" || key(t, standby, "wireguard") != "wg-a" {
			t.Fatal("restored ledger has other keys")
		}
		if got, want := views(standby), views(active); got != want {
			t.Fatalf("restored views %s, want %s", got, want)
		}
		// Nothing newer: a second Restore keeps the ledger as it is.
		if gen, err := snaps.Restore(ctx, standby, "identity"); err != nil || gen != 0 {
			t.Fatalf("second Restore = %d, %v; want 0", gen, err)
		}
	})

	t.Run("an older generation never overwrites a newer one", func(t *testing.T) {
		next := replica(t)
		if _, err := snaps.Restore(ctx, next, "identity"); err != nil {
			t.Fatal(err)
		}
		write(t, next, "note", "written by the next active")
		write(t, next, "note2", "and again")
		if err := snaps.Write(ctx, next); err != nil {
			t.Fatal(err)
		}
		newest := secretGeneration(t, kube)
		if newest != next.Generation() {
			t.Fatalf("Secret at generation %d, the writer at %d", newest, next.Generation())
		}
		// The old active wrote once more locally: it is behind, and not
		// the writer of the newest snapshot.
		write(t, active, "stale", "x")
		fresh := replica(t)
		write(t, fresh, "identity", "seed-a")
		for name, l := range map[string]*ipam.Ledger{"the old active": active, "a replica that never restored": fresh} {
			if err := snaps.Write(ctx, l); !errors.Is(err, ErrSuperseded) {
				t.Errorf("%s writes: %v, want ErrSuperseded", name, err)
			}
		}
		if got := secretGeneration(t, kube); got != newest {
			t.Fatalf("Secret at generation %d after refused writes, want %d", got, newest)
		}
		// The old active restores and is then in line again.
		if gen, err := snaps.Restore(ctx, active, "identity"); err != nil || gen != newest {
			t.Fatalf("old active restores: %d, %v; want %d", gen, err, newest)
		}
		if _, err := active.Key("stale"); !errors.Is(err, ipam.ErrNotFound) {
			t.Fatalf("the old active kept a write the newest snapshot does not hold: %v", err)
		}
		write(t, active, "after", "y")
		if err := snaps.Write(ctx, active); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("run writes after commits", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- (&Snapshots{Kube: kube, Namespace: namespace, Log: slog.Default()}).Run(ctx, active) }()
		for i := range 20 {
			write(t, active, "burst", fmt.Sprint(i))
		}
		eventually.Within(t, 30*time.Second, "the Secret at the ledger's generation", func() error {
			if got, want := secretGeneration(t, kube), active.Generation(); got != want {
				return fmt.Errorf("Secret at generation %d, ledger at %d", got, want)
			}
			return nil
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	})

	t.Run("a standby follows each new snapshot into its own ledger, which it does not hold open", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), ipam.FileName) // a wiped state directory
		var log syncBuffer
		followCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			(&Snapshots{Kube: kube, Namespace: namespace, Log: slog.New(slog.NewTextHandler(&log, nil))}).Follow(followCtx,
				func() (*ipam.Ledger, error) { return ipam.Open(path, ipam.Options{}) }, "identity")
		}()
		stopped := false
		defer func() {
			if !stopped {
				stop()
				<-done
			}
		}()
		restored := func(gen uint64) {
			t.Helper()
			eventually.Within(t, 30*time.Second, fmt.Sprintf("the standby restored generation %d", gen), func() error {
				if !strings.Contains(log.String(), fmt.Sprintf(`msg="ledger restored from its snapshot" secret=%s/%s generation=%d`, namespace, SecretName, gen)) {
					return fmt.Errorf("not logged yet:\n%s", log.String())
				}
				return nil
			})
		}
		restored(secretGeneration(t, kube))
		// Between restores the file is not held: another opens it at once.
		l, err := ipam.Open(path, ipam.Options{ReadOnly: true, LockTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatalf("the standby holds its ledger between restores: %v", err)
		}
		l.Close()
		write(t, active, "later", "z")
		if err := snaps.Write(ctx, active); err != nil {
			t.Fatal(err)
		}
		newest := secretGeneration(t, kube)
		restored(newest)
		stop()
		<-done
		stopped = true
		// The takeover finds the ledger restored: the same keys and views,
		// and nothing left to restore.
		standby, err := ipam.Open(path, ipam.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer standby.Close()
		if standby.Generation() != newest || key(t, standby, "identity") != "seed-a" || key(t, standby, "later") != "z" {
			t.Errorf("the standby's ledger at generation %d, identity %q; want %d, seed-a, and the later key", standby.Generation(), key(t, standby, "identity"), newest)
		}
		if got, want := views(standby), views(active); got != want {
			t.Errorf("the standby's views %s, want %s", got, want)
		}
		if gen, err := snaps.Restore(ctx, standby, "identity"); err != nil || gen != 0 {
			t.Errorf("the takeover's Restore = %d, %v; want nothing left to restore", gen, err)
		}
	})

	t.Run("a damaged snapshot is refused and loses nothing", func(t *testing.T) {
		sec, err := kube.CoreV1().Secrets(namespace).Get(ctx, SecretName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		good := bytes.Clone(sec.Data[SecretKey])
		sec.Data[SecretKey][len(good)/2] ^= 1
		if _, err := kube.CoreV1().Secrets(namespace).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		behind := replica(t)
		write(t, behind, "identity", "seed-a")
		_, err = snaps.Restore(ctx, behind, "identity")
		if !errors.Is(err, ipam.ErrBadSnapshot) || !strings.Contains(err.Error(), "local ledger is kept") {
			t.Fatalf("Restore from a damaged snapshot: %v", err)
		}
		if key(t, behind, "identity") != "seed-a" || behind.Generation() != 1 {
			t.Fatal("a refused restore changed the ledger")
		}
		// The active replaces it.
		write(t, active, "after-damage", "z")
		if err := snaps.Write(ctx, active); err != nil {
			t.Fatal(err)
		}
		if got := secretGeneration(t, kube); got != active.Generation() {
			t.Fatalf("Secret at generation %d, ledger at %d", got, active.Generation())
		}
	})

	t.Run("a ledger never replicated yields to the recorded identity; a replicated one does not", func(t *testing.T) {
		// A replica that made an identity and lost the Lease before its
		// first snapshot was written.
		lost := replica(t)
		write(t, lost, "identity", "seed-never-recorded")
		gen, err := snaps.Restore(ctx, lost, "identity")
		if err != nil || gen != active.Generation() || key(t, lost, "identity") != "seed-a" {
			t.Fatalf("Restore over a ledger never replicated: generation %d, %v, identity %q; want %d and seed-a", gen, err, key(t, lost, "identity"), active.Generation())
		}
		aside, _ := filepath.Glob(lost.Path() + ".superseded-*")
		if len(aside) != 1 {
			t.Fatalf("ledgers set aside: %v, want one", aside)
		}
		// One that wrote or restored a snapshot once keeps its own.
		other := replica(t)
		write(t, other, "identity", "seed-of-another-cluster")
		if err := other.MarkReplicated(other.Generation()); err != nil {
			t.Fatal(err)
		}
		if _, err := snaps.Restore(ctx, other, "identity"); !errors.Is(err, ipam.ErrForeignSnapshot) || key(t, other, "identity") != "seed-of-another-cluster" {
			t.Fatalf("Restore over a replicated ledger of another identity: %v, identity %q", err, key(t, other, "identity"))
		}
	})

	t.Run("a Secret of the same name not ours is left alone", func(t *testing.T) {
		if err := kube.CoreV1().Secrets(namespace).Delete(ctx, SecretName, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		theirs := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: SecretName, Namespace: namespace}, Data: map[string][]byte{"x": []byte("theirs")}}
		if _, err := kube.CoreV1().Secrets(namespace).Create(ctx, theirs, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		write(t, active, "more", "m")
		if err := snaps.Write(ctx, active); err == nil || !strings.Contains(err.Error(), "not the agent's") {
			t.Fatalf("Write over a foreign Secret: %v", err)
		}
		if _, err := snaps.Restore(ctx, replica(t), "identity"); err == nil || !strings.Contains(err.Error(), "not the agent's") {
			t.Fatalf("Restore from a foreign Secret: %v", err)
		}
		got, err := kube.CoreV1().Secrets(namespace).Get(ctx, SecretName, metav1.GetOptions{})
		if err != nil || string(got.Data["x"]) != "theirs" || len(got.Data) != 1 {
			t.Fatalf("the foreign Secret changed: %v %v", got.Data, err)
		}
	})
}
