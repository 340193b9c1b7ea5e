// Package ha keeps a cluster's gateway running when its node goes: the
// ledger replicated to a Secret the standby restores from (Snapshots).
// See docs/ha.md.
package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/ipam"
)

// The Secret the active replica writes its ledger into, in the agent's
// namespace.
const (
	SecretName = "flotilla-ledger"
	// SecretKey holds the encoded snapshot (ipam.Ledger.Snapshot).
	SecretKey = "ledger"
	// GenerationAnnotation repeats the snapshot's generation for people;
	// the agent trusts only the one inside the checksummed data.
	GenerationAnnotation = "flotilla.io/ledger-generation"
)

// Labels mark the Secret as the agent's.
var Labels = map[string]string{
	"app.kubernetes.io/name":       "flotilla",
	"app.kubernetes.io/managed-by": "flotilla",
	"app.kubernetes.io/component":  "ledger-snapshot",
}

// MaxSnapshot is the largest snapshot a Secret holds (the API server's
// limit is 1 MiB, the object's metadata included).
const MaxSnapshot = 1000 * 1024

// DefaultDebounce is how long the writer lets commits gather before it
// writes one snapshot of them all.
const DefaultDebounce = 200 * time.Millisecond

// ErrSuperseded is returned by Write when the Secret holds a snapshot
// this ledger neither wrote nor restored: another replica wrote since,
// and this one must restore before it writes again.
var ErrSuperseded = errors.New("another replica wrote a newer ledger snapshot")

// Snapshots reads and writes the ledger's snapshot Secret.
type Snapshots struct {
	Kube      kubeclient.Interface
	Namespace string
	Log       *slog.Logger
	// Debounce is how long Run gathers commits; zero means DefaultDebounce.
	Debounce time.Duration

	mu sync.Mutex
	// written is the Secret as this writer last wrote it: the next write
	// updates it on its resourceVersion without reading it first, and reads
	// it only when someone else changed it since (a conflict).
	written *corev1.Secret
}

func (s *Snapshots) where() string { return s.Namespace + "/" + SecretName }

// Newest returns the snapshot in the Secret, nil when there is none. A
// Secret that is not ours, or whose snapshot does not read, is an error.
func (s *Snapshots) Newest(ctx context.Context) (*ipam.Snapshot, error) {
	sec, err := s.Kube.CoreV1().Secrets(s.Namespace).Get(ctx, SecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the ledger snapshot %s: %w", s.where(), err)
	}
	return s.decode(sec)
}

// decode is the snapshot the Secret sec holds.
func (s *Snapshots) decode(sec *corev1.Secret) (*ipam.Snapshot, error) {
	if err := ours(sec); err != nil {
		return nil, err
	}
	snap, err := ipam.DecodeSnapshot(sec.Data[SecretKey])
	if err != nil {
		return nil, fmt.Errorf("ledger snapshot %s: %w; the local ledger is kept (delete the Secret to have the active replica write it anew)", s.where(), err)
	}
	return snap, nil
}

// FollowEvery is the least time between two restores of a standby that
// follows the snapshots (Follow): the active replica may write one every
// DefaultDebounce, and each restore rewrites the standby's ledger file.
const FollowEvery = time.Second

// Follow keeps a standby's ledger at the newest snapshot, until ctx
// ends: it watches the Secret and restores each newer snapshot into the
// ledger open opens (and Follow closes again at once: the ledger is not
// the standby's to hold), at most every FollowEvery. A takeover then
// finds the ledger restored, or one snapshot behind, and its restore
// (RestoreFrom) has little or nothing left to do; and the standby's disk
// holds the cluster's state as well as the Secret. A snapshot that does
// not read or restore is logged once and skipped; the takeover meets it
// again and decides.
func (s *Snapshots) Follow(ctx context.Context, open func() (*ipam.Ledger, error), sameKey string) {
	changed := make(chan struct{}, 1)
	kick := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	inf := kubeclient.NewInformer(&corev1.Secret{}, s.Kube.CoreV1().Secrets(s.Namespace), kubeclient.ByName(SecretName))
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: kick, UpdateFunc: func(_, cur any) { kick(cur) },
	}); err != nil {
		s.Log.Error("cannot follow the ledger snapshots; a takeover restores the newest", "err", err)
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { inf.RunWithContext(ctx) })
	var failing string
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		obj, ok, _ := inf.GetStore().GetByKey(s.where())
		sec, _ := obj.(*corev1.Secret)
		if !ok || sec == nil {
			continue
		}
		if gen, err := s.restore(sec, open, sameKey); err != nil {
			if err.Error() != failing {
				s.Log.Warn("the standby's ledger does not follow the snapshot; a takeover restores the newest", "secret", s.where(), "err", err)
				failing = err.Error()
			}
		} else if gen > 0 {
			failing = ""
		}
		if !sleep(ctx, FollowEvery) {
			return
		}
	}
}

// restore brings the ledger open opens to the snapshot in sec, when it
// is behind it: the generation restored, or 0 when it was not.
func (s *Snapshots) restore(sec *corev1.Secret, open func() (*ipam.Ledger, error), sameKey string) (uint64, error) {
	snap, err := s.decode(sec)
	if err != nil {
		return 0, err
	}
	ledger, err := open()
	if err != nil {
		return 0, err
	}
	gen, err := s.RestoreFrom(ledger, snap, sameKey)
	if cerr := ledger.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close the ledger: %w", cerr)
	}
	return gen, err
}

func ours(sec *corev1.Secret) error {
	if sec.Labels["app.kubernetes.io/managed-by"] != "flotilla" {
		return fmt.Errorf("Secret %s/%s is not the agent's (no label app.kubernetes.io/managed-by=flotilla); it is left alone and the ledger is not replicated until it is removed", sec.Namespace, sec.Name)
	}
	return nil
}

// Restore brings ledger to the newest snapshot when it is behind it or
// another replica wrote since (ipam.Ledger.ShouldRestore), refusing one
// whose key sameKey (the identity) differs from the ledger's unless the
// ledger was never replicated (ipam.Ledger.Restore). It returns
// the generation restored, or 0 when the ledger was kept as it is.
func (s *Snapshots) Restore(ctx context.Context, ledger *ipam.Ledger, sameKey string) (uint64, error) {
	snap, err := s.Newest(ctx)
	if err != nil {
		return 0, err
	}
	return s.RestoreFrom(ledger, snap, sameKey)
}

// RestoreFrom is Restore with the snapshot Newest read (nil when there is
// none), so that the read can run while the ledger opens.
func (s *Snapshots) RestoreFrom(ledger *ipam.Ledger, snap *ipam.Snapshot, sameKey string) (uint64, error) {
	if snap == nil {
		return 0, nil
	}
	if !ledger.ShouldRestore(snap.Generation) {
		return 0, nil
	}
	setAside, err := ledger.Restore(snap, sameKey)
	if setAside != "" {
		s.Log.Warn("this replica's ledger was never replicated and holds another identity than the snapshot, the one the cluster recorded: the snapshot replaces it; the ledger is kept aside",
			"secret", s.where(), "setAside", setAside)
	}
	if err != nil {
		return 0, fmt.Errorf("restore from %s: %w", s.where(), err)
	}
	s.Log.Info("ledger restored from its snapshot", "secret", s.where(), "generation", snap.Generation)
	return snap.Generation, nil
}

// Write puts the ledger's current snapshot into the Secret unless it
// holds that generation already. It never overwrites a snapshot this
// ledger did not write or restore (ErrSuperseded), and a concurrent
// writer makes it read again (the update is conditional on the Secret's
// resourceVersion). A Secret whose snapshot does not read is replaced:
// this ledger is intact, and a replica that starts needs a readable one.
func (s *Snapshots) Write(ctx context.Context, ledger *ipam.Ledger) error {
	gen, enc, err := ledger.Snapshot()
	if err != nil {
		return err
	}
	if len(enc) > MaxSnapshot {
		return fmt.Errorf("ledger snapshot of generation %d is %d bytes, more than a Secret holds (%d); the standby cannot take over with this ledger's state", gen, len(enc), MaxSnapshot)
	}
	secrets := s.Kube.CoreV1().Secrets(s.Namespace)
	s.mu.Lock()
	defer s.mu.Unlock()
	if last := s.written; last != nil && generationOf(last) == ledger.Replicated() {
		if generationOf(last) == gen {
			return nil
		}
		updated, err := secrets.Update(ctx, s.secret(gen, enc, last), metav1.UpdateOptions{})
		if err == nil {
			s.written = updated
			return ledger.MarkReplicated(gen)
		}
		s.written = nil
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("update the ledger snapshot %s: %w", s.where(), err)
		}
		// Changed since this writer's last write: read it and decide.
	}
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			return fmt.Errorf("write the ledger snapshot %s: the Secret kept changing under this writer", s.where())
		}
		sec, err := secrets.Get(ctx, SecretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			created, err := secrets.Create(ctx, s.secret(gen, enc, nil), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("create the ledger snapshot %s: %w", s.where(), err)
			}
			s.written = created
			return ledger.MarkReplicated(gen)
		}
		if err != nil {
			return fmt.Errorf("read the ledger snapshot %s: %w", s.where(), err)
		}
		if err := ours(sec); err != nil {
			return err
		}
		if have, err := ipam.DecodeSnapshot(sec.Data[SecretKey]); err == nil {
			switch {
			case have.Generation == gen && have.Generation == ledger.Replicated():
				return nil
			case have.Generation != ledger.Replicated() || have.Generation > gen:
				return fmt.Errorf("%w: %s holds generation %d, this ledger is at %d and last wrote or restored %d", ErrSuperseded, s.where(), have.Generation, gen, ledger.Replicated())
			}
		} else {
			s.Log.Warn("the ledger snapshot does not read; replacing it", "secret", s.where(), "err", err)
		}
		updated, err := secrets.Update(ctx, s.secret(gen, enc, sec), metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("update the ledger snapshot %s: %w", s.where(), err)
		}
		s.written = updated
		return ledger.MarkReplicated(gen)
	}
}

// generationOf is the generation a Secret this writer wrote says it holds
// (its annotation; 0 when it does not parse).
func generationOf(sec *corev1.Secret) uint64 {
	g, _ := strconv.ParseUint(sec.Annotations[GenerationAnnotation], 10, 64)
	return g
}

// secret is the Secret holding enc, over the one read (old) if any.
func (s *Snapshots) secret(gen uint64, enc []byte, old *corev1.Secret) *corev1.Secret {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: SecretName, Namespace: s.Namespace}, Type: corev1.SecretTypeOpaque}
	if old != nil {
		sec = old.DeepCopy()
	}
	if sec.Labels == nil {
		sec.Labels = map[string]string{}
	}
	for k, v := range Labels {
		sec.Labels[k] = v
	}
	if sec.Annotations == nil {
		sec.Annotations = map[string]string{}
	}
	sec.Annotations[GenerationAnnotation] = strconv.FormatUint(gen, 10)
	sec.Data = map[string][]byte{SecretKey: enc}
	return sec
}

// Run writes a snapshot after the ledger's commits, those within
// Debounce of each other together, until ctx ends or another replica
// writes (ErrSuperseded, returned). A failed write is retried with a
// backoff, and logged once until one succeeds. When ctx ends, what was
// committed since the last write is written within FlushTimeout.
func (s *Snapshots) Run(ctx context.Context, ledger *ipam.Ledger) error {
	err := s.run(ctx, ledger)
	if err == nil && ledger.Generation() != ledger.Replicated() {
		flush, cancel := context.WithTimeout(context.WithoutCancel(ctx), FlushTimeout)
		defer cancel()
		if err := s.Write(flush, ledger); err != nil {
			s.Log.Warn("the last ledger changes were not written to the snapshot", "secret", s.where(), "err", err)
		}
	}
	return err
}

// FlushTimeout bounds the last write of a stopping Run.
const FlushTimeout = 2 * time.Second

func (s *Snapshots) run(ctx context.Context, ledger *ipam.Ledger) error {
	debounce := s.Debounce
	if debounce <= 0 {
		debounce = DefaultDebounce
	}
	backoff := debounce
	var failing string
	written := uint64(0)
	for {
		if written > 0 || ledger.Replicated() == ledger.Generation() {
			if _, err := ledger.WaitGeneration(ctx, max(written, ledger.Replicated())); err != nil {
				return nil
			}
			if !sleep(ctx, debounce) {
				return nil
			}
		}
		err := s.Write(ctx, ledger)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrSuperseded):
			return err
		case err != nil:
			if err.Error() != failing {
				s.Log.Error("ledger snapshot not written; retrying", "secret", s.where(), "err", err)
				failing = err.Error()
			}
			if !sleep(ctx, backoff) {
				return nil
			}
			backoff = min(2*backoff, 10*time.Second)
			written = 0 // retry without waiting for a commit
			continue
		}
		if failing != "" {
			s.Log.Info("ledger snapshot written again", "secret", s.where(), "generation", ledger.Replicated())
			failing = ""
		}
		backoff = debounce
		written = ledger.Replicated()
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
