package dnsforward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// FieldManager is the agent's field manager for what it applies.
const FieldManager = "flotilla"

// CorefileKey is the ConfigMap key CoreDNS reads its Corefile from, as
// kubeadm and CoreDNS's own manifests install it.
const CorefileKey = "Corefile"

// Policy is the ValidatingAdmissionPolicy deploy/coredns-forward installs
// to confine the agent's writes in the Corefile to its own block; the
// Keeper writes nothing until a dry run proves it refuses a change outside
// the block.
const Policy = "flotilla-agent-coredns-forward"

// Config is what a Keeper needs.
type Config struct {
	Client kubeclient.Interface
	// Corefile is CoreDNS's ConfigMap (kube-system/coredns as kubeadm
	// installs it).
	Corefile types.NamespacedName
	// Service is the agent's DNS Service, whose ClusterIP the block
	// forwards the zone to.
	Service types.NamespacedName
	// Recheck is how long a proof of the fence holds before the next
	// write proves it again (default 5 minutes).
	Recheck time.Duration
	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// Keeper keeps the agent's block in the Corefile forwarding to the
// Service's ClusterIP, watching both; it writes the Corefile only when the
// block differs, with server-side apply conditioned on the version it
// read, so an edit made meanwhile is never overwritten.
type Keeper struct {
	cfg  Config
	loop *ctrl.Controller[string]
	// One informer of one object each: CoreDNS's ConfigMap and the
	// agent's DNS Service.
	cmInf, svcInf toolscache.SharedIndexInformer
	errs          ctrl.ErrorLog[string]

	mu       sync.Mutex
	fence    error     // the last proof's verdict; errNotProven before one
	provenAt time.Time // when the fence was last proven
	reverse  []netip.Prefix
}

// errNotProven is the fence's verdict before the first proof.
var errNotProven = errors.New("not proven yet")

// New prepares a Keeper; Run watches and writes.
func New(cfg Config) (*Keeper, error) {
	if cfg.Client == nil || cfg.Corefile.Name == "" || cfg.Service.Name == "" {
		return nil, errors.New("coredns forward: a client, the Corefile's ConfigMap, and the DNS Service are required")
	}
	if cfg.Recheck == 0 {
		cfg.Recheck = 5 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	k := &Keeper{cfg: cfg, fence: errNotProven, errs: ctrl.ErrorLog[string]{
		Logger: cfg.Logger, Failed: "CoreDNS forwarding of clusterset.local not written; retrying",
		Recovered: "CoreDNS forwarding of clusterset.local written",
		// A write that raced an edit is retried from the edit at once.
		Level: func(err error) slog.Level {
			if apierrors.IsConflict(err) {
				return slog.LevelDebug
			}
			return slog.LevelWarn
		},
	}}
	var err error
	k.loop, err = ctrl.New(ctrl.Config[string]{
		Name: "coredns_forward", BaseDelay: 200 * time.Millisecond, MaxDelay: 30 * time.Second,
		Metrics: cfg.Metrics, Errors: &k.errs,
		Reconcile: ctrl.WithoutDelay(func(ctx context.Context, _ string) error { return k.reconcile(ctx) }),
	})
	if err != nil {
		return nil, err
	}
	if k.cmInf, err = oneObject(&corev1.ConfigMap{}, cfg.Client.CoreV1().ConfigMaps(cfg.Corefile.Namespace), cfg.Corefile.Name); err != nil {
		return nil, err
	}
	if k.svcInf, err = oneObject(&corev1.Service{}, cfg.Client.CoreV1().Services(cfg.Service.Namespace), cfg.Service.Name); err != nil {
		return nil, err
	}
	for what, inf := range map[string]toolscache.SharedIndexInformer{"ConfigMap " + cfg.Corefile.String(): k.cmInf, "Service " + cfg.Service.String(): k.svcInf} {
		if _, err := inf.AddEventHandler(ctrl.OnEvery(func(any) { k.loop.Add("corefile") })); err != nil {
			return nil, err
		}
		// Without the rights deploy/coredns-forward grants, the watch
		// fails: said once, not at every retry.
		if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *toolscache.Reflector, err error) {
			k.errs.Note("watch "+what, fmt.Errorf("watch %s: %w", what, err))
		}); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// oneObject is an informer of the one object name: the agent may read no
// other ConfigMap of CoreDNS's namespace.
func oneObject[L runtime.Object](obj runtime.Object, c kubeclient.ListWatcher[L], name string) (toolscache.SharedIndexInformer, error) {
	inf := kubeclient.NewInformer(obj, c, kubeclient.ByName(name))
	if err := inf.SetTransform(kubeclient.DropManagedFields); err != nil {
		return nil, err
	}
	return inf, nil
}

// SetReverse sets the prefixes whose reverse zones the block forwards to
// the agent too: the views of the peers' networks, where the imported
// endpoints of headless Services are. It does not block: the block is
// written by Run's loop.
func (k *Keeper) SetReverse(prefixes []netip.Prefix) {
	k.mu.Lock()
	same := slices.Equal(k.reverse, prefixes)
	k.reverse = slices.Clone(prefixes)
	k.mu.Unlock()
	if !same {
		k.loop.Add("corefile")
	}
}

// Run keeps the block until ctx ends. The block stays when the agent
// stops: CoreDNS keeps forwarding to the Service while the agent restarts.
// Remove takes it out.
func (k *Keeper) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { k.cmInf.RunWithContext(ctx) })
	wg.Go(func() { k.svcInf.RunWithContext(ctx) })
	if !toolscache.WaitForCacheSync(ctx.Done(), k.cmInf.HasSynced, k.svcInf.HasSynced) {
		return nil
	}
	k.loop.Add("corefile")
	return k.loop.Run(ctx, nil)
}

// reconcile writes the block for the Service's ClusterIP into the
// Corefile if it is not there as it should be.
func (k *Keeper) reconcile(ctx context.Context) error {
	obj, ok, err := k.svcInf.GetStore().GetByKey(k.cfg.Service.String())
	if err != nil || !ok {
		return fmt.Errorf("Service %s: not found (deploy/clusterset-dns.yaml installs it)", k.cfg.Service)
	}
	svc := obj.(*corev1.Service)
	addr, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		return fmt.Errorf("Service %s: ClusterIP %q: want an address (not headless)", k.cfg.Service, svc.Spec.ClusterIP)
	}
	obj, ok, err = k.cmInf.GetStore().GetByKey(k.cfg.Corefile.String())
	if err != nil || !ok {
		return fmt.Errorf("ConfigMap %s: not found (is CoreDNS installed there?)", k.cfg.Corefile)
	}
	cm := obj.(*corev1.ConfigMap)
	corefile, ok := cm.Data[CorefileKey]
	if !ok {
		return fmt.Errorf("ConfigMap %s has no key %q", k.cfg.Corefile, CorefileKey)
	}
	k.mu.Lock()
	reverse := k.reverse
	k.mu.Unlock()
	want, err := WithBlock(corefile, Block(addr, reverse))
	if err != nil {
		return fmt.Errorf("ConfigMap %s, %s: %w; put them back as the agent wrote them or remove both", k.cfg.Corefile, CorefileKey, err)
	}
	if want == corefile {
		return nil
	}
	if err := k.proveFence(ctx, cm); err != nil {
		return err
	}
	if err := apply(ctx, k.cfg.Client, cm, want, nil); err != nil {
		return err
	}
	k.cfg.Logger.Info("CoreDNS forwards clusterset.local to the agent", "configmap", k.cfg.Corefile.String(), "to", netip.AddrPortFrom(addr, 53).String(), "reverseZones", reverseZones(reverse))
	return nil
}

// Fence is the verdict of the last proof that the policy confines the
// agent's writes to its block: nil when proven, an error that says why the
// Keeper writes nothing otherwise.
func (k *Keeper) Fence() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.fence
}

// proveFence proves, unless proven within Recheck, that the policy refuses
// the agent's own credential a change of the Corefile outside its block:
// a server-side dry run of one, which writes nothing. Without the policy
// the Role's patch would let a compromised agent rewrite the cluster's
// DNS, so the Keeper fails closed: it writes nothing until proven.
func (k *Keeper) proveFence(ctx context.Context, cm *corev1.ConfigMap) error {
	k.mu.Lock()
	fresh := k.fence == nil && time.Since(k.provenAt) < k.cfg.Recheck
	k.mu.Unlock()
	if fresh {
		return nil
	}
	outside := cm.Data[CorefileKey] + "\n# flotilla: fence probe (a dry run; never written)\n"
	err := apply(ctx, k.cfg.Client, cm, outside, []string{metav1.DryRunAll})
	var verdict error
	switch {
	case err == nil:
		verdict = fmt.Errorf("ValidatingAdmissionPolicy %s is not enforced: a change outside the agent's block was allowed (a dry run); install deploy/coredns-forward whole, on Kubernetes 1.30 or newer", Policy)
	case (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(err.Error(), Policy):
		verdict = nil
	case apierrors.IsConflict(err):
		return err // the ConfigMap changed: the next pass starts from it
	default:
		verdict = fmt.Errorf("proving ValidatingAdmissionPolicy %s enforced: %w", Policy, err)
	}
	k.mu.Lock()
	k.fence = verdict
	if verdict == nil {
		k.provenAt = time.Now()
	}
	k.mu.Unlock()
	if verdict != nil {
		return fmt.Errorf("CoreDNS's Corefile not written: %w", verdict)
	}
	return nil
}

// apply writes corefile into cm by server-side apply, only if cm is still
// at the version read: a change made since fails with a conflict, and the
// next pass starts from it. dryRun, when set, writes nothing.
func apply(ctx context.Context, c kubeclient.Interface, cm *corev1.ConfigMap, corefile string, dryRun []string) error {
	ac := corev1ac.ConfigMap(cm.Name, cm.Namespace).
		WithResourceVersion(cm.ResourceVersion).
		WithData(map[string]string{CorefileKey: corefile})
	if _, err := c.CoreV1().ConfigMaps(cm.Namespace).Apply(ctx, ac, metav1.ApplyOptions{FieldManager: FieldManager, Force: true, DryRun: dryRun}); err != nil {
		return fmt.Errorf("write ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return nil
}

// Remove takes the agent's block out of the Corefile in name, if it is
// there, leaving the Corefile as it was before the agent wrote it. A
// ConfigMap the agent may not read, or that is not there, has no block of
// the agent's: removed is false and err nil.
func Remove(ctx context.Context, c kubeclient.Interface, name types.NamespacedName) (removed bool, err error) {
	for range 5 {
		cm, err := c.CoreV1().ConfigMaps(name.Namespace).Get(ctx, name.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("read ConfigMap %s: %w", name, err)
		}
		without, err := WithoutBlock(cm.Data[CorefileKey])
		if err != nil {
			return false, fmt.Errorf("ConfigMap %s, %s: %w", name, CorefileKey, err)
		}
		if without == cm.Data[CorefileKey] {
			return false, nil
		}
		err = apply(ctx, c, cm, without, nil)
		if err == nil {
			return true, nil
		}
		if !apierrors.IsConflict(err) {
			return false, err
		}
	}
	return false, fmt.Errorf("ConfigMap %s changed under every try", name)
}
