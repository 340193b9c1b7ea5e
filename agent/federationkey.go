package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/ipam"
)

// The federation Secret and the key status, as agentapi names them.
const (
	FederationSecret     = agentapi.FederationSecret
	SecretKeyring        = agentapi.SecretKeyring
	SecretToken          = agentapi.SecretToken
	FederationKeysStatus = agentapi.FederationKeysStatus
	StatusKeys           = agentapi.StatusKeys
	StatusError          = agentapi.StatusError
	StatusCluster        = agentapi.StatusCluster
)

// keyring is what of discovery the key rotation drives.
type keyring interface {
	Keys() [][]byte
	InstallKey([]byte) error
	UseKey([]byte) error
	RemoveKey([]byte) error
}

// applyKeyring makes held hold exactly want, want[0] as the primary key:
// it installs the new keys first, then switches the primary, then removes
// the keys no longer listed, so a member never stops decrypting what a
// member still encrypts with. It reports whether anything changed.
func applyKeyring(held keyring, want [][]byte) (bool, error) {
	if len(want) == 0 {
		return false, errors.New("the keyring lists no key")
	}
	changed := false
	for _, k := range want {
		if !containsKey(held.Keys(), k) {
			if err := held.InstallKey(k); err != nil {
				return changed, err
			}
			changed = true
		}
	}
	if !bytes.Equal(held.Keys()[0], want[0]) {
		if err := held.UseKey(want[0]); err != nil {
			return changed, err
		}
		changed = true
	}
	for _, k := range held.Keys() {
		if !containsKey(want, k) {
			if err := held.RemoveKey(k); err != nil {
				return changed, err
			}
			changed = true
		}
	}
	return changed, nil
}

func containsKey(keys [][]byte, k []byte) bool {
	return slices.ContainsFunc(keys, func(h []byte) bool { return bytes.Equal(h, k) })
}

// secretKeys is what the FederationSecret says at start: its keyring and
// its join token, each nil when absent.
type secretKeys struct {
	keys  [][]byte
	token *discovery.JoinToken
}

// secretFederation reads the FederationSecret at start; zero when there
// is none (no Secret, or no permission to read it: the flags and the
// ledger then say). A damaged keyring or token is logged and ignored
// here; the follower reports a keyring's in the status. It never fails:
// the error is for startBackground.
func (a *Agent) secretFederation(ctx context.Context) (secretKeys, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := a.kube.CoreV1().Secrets(a.agentNamespace()).Get(ctx, FederationSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return secretKeys{}, nil
	}
	if err != nil {
		a.log.Warn("cannot read the federation keyring at start; starting with the key of the flags or the ledger", "secret", FederationSecret, "err", err)
		return secretKeys{}, nil
	}
	var out secretKeys
	if len(s.Data[SecretKeyring]) > 0 {
		keys, err := discovery.DecodeKeyring(s.Data[SecretKeyring])
		if err != nil {
			a.log.Warn("the federation keyring in the Secret is damaged; starting with the key of the flags or the ledger", "secret", FederationSecret, "err", err)
		} else {
			out.keys = keys
		}
	}
	if len(s.Data[SecretToken]) > 0 {
		tok, err := discovery.ParseFederationKey(string(s.Data[SecretToken]))
		if err != nil {
			a.log.Warn("the join token in the Secret is damaged; starting with the key of the flags or the ledger", "secret", FederationSecret, "entry", SecretToken, "err", err)
		} else {
			out.token = &tok
		}
	}
	return out, nil
}

// keyFollower applies the FederationSecret's keyring to discovery,
// persists it in the ledger, and reports what discovery holds.
type keyFollower struct {
	a      *Agent
	held   keyring
	ledger *ipam.Ledger
	ns     string
	// clusterID and gossip name this cluster in the join token published.
	clusterID, gossip string
	store             toolscache.Store
	queue             ctrl.Queue[string]
	// Failures of the watch and of the work are logged once per change.
	watchLog, workLog logOnce
}

// logOnce logs a failure when it differs from the last one logged.
type logOnce struct {
	mu   sync.Mutex
	last string
}

// report logs err once per change; nil clears it.
func (o *logOnce) report(log *slog.Logger, err error) {
	text := errText(err)
	o.mu.Lock()
	same := text == o.last
	o.last = text
	o.mu.Unlock()
	if !same && err != nil {
		log.Warn("federation keyring not applied", "err", err)
	}
}

// followFederationKeys watches the FederationSecret and applies its
// keyring, as a component. Without permission to read the Secret (an
// install from before key rotation) it logs that and the agent keeps the
// keys it has.
func (a *Agent) followFederationKeys(comps *components, held keyring, ledger *ipam.Ledger, clusterID, gossip string) error {
	f := &keyFollower{a: a, held: held, ledger: ledger, ns: a.agentNamespace(), clusterID: clusterID, gossip: gossip}
	// Its errors are logged by reconcile, the keyring's too.
	c, err := ctrl.New(ctrl.Config[string]{
		Name: "federation_keys", BaseDelay: 200 * time.Millisecond, Metrics: a.registry,
		Reconcile: func(ctx context.Context, _ string) (time.Duration, error) { return 0, f.reconcile(ctx) },
	})
	if err != nil {
		return fmt.Errorf("federation keys: %w", err)
	}
	f.queue = c.Queue()
	// Only this Secret: the agent may read no other.
	inf := kubeclient.NewInformer(&corev1.Secret{}, a.kube.CoreV1().Secrets(f.ns), kubeclient.ByName(FederationSecret))
	if err := inf.SetTransform(kubeclient.DropManagedFields); err != nil {
		return fmt.Errorf("watch Secret %s: %w", FederationSecret, err)
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *toolscache.Reflector, err error) {
		f.watchLog.report(a.log, fmt.Errorf("watch Secret %s/%s: %w (deploy/rbac.yaml lets the agent read it)", f.ns, FederationSecret, err))
	}); err != nil {
		return fmt.Errorf("watch Secret %s: %w", FederationSecret, err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { f.queue.Add(FederationSecret) },
		UpdateFunc: func(any, any) { f.queue.Add(FederationSecret) },
		DeleteFunc: func(any) { f.queue.Add(FederationSecret) },
	}); err != nil {
		return fmt.Errorf("watch Secret %s: %w", FederationSecret, err)
	}
	f.store = inf.GetStore()
	a.registry.MustRegister(keyCollector{held})
	comps.Go("federation keys", func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		var informer sync.WaitGroup
		defer informer.Wait()
		defer cancel()
		informer.Go(func() { inf.RunWithContext(ctx) })
		// The status says what the agent holds even before the Secret is
		// read (or when it cannot be).
		f.queue.Add(FederationSecret)
		return c.Run(ctx, nil)
	})
	return nil
}

// reconcile applies the Secret's keyring, if there is one, writes the
// status and publishes the join token of the key held. An error in the
// keyring is reported in the status and not retried: the next change of
// the Secret is.
func (f *keyFollower) reconcile(ctx context.Context) error {
	applyErr := f.apply()
	status := corev1ac.ConfigMap(FederationKeysStatus, f.ns).
		WithLabels(map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/managed-by": "flotilla"}).
		WithData(map[string]string{
			StatusCluster: f.a.cfg.ClusterName,
			StatusKeys:    strings.Join(agentapi.Fingerprints(f.held.Keys()), ","),
			StatusError:   errText(applyErr),
		})
	if _, err := f.a.kube.CoreV1().ConfigMaps(f.ns).Apply(ctx, status, metav1.ApplyOptions{FieldManager: "flotilla", Force: true}); err != nil {
		err = fmt.Errorf("write ConfigMap %s/%s: %w", f.ns, FederationKeysStatus, err)
		f.workLog.report(f.a.log, err)
		return err
	}
	if err := f.publishJoinToken(ctx); err != nil {
		f.workLog.report(f.a.log, err)
		return err
	}
	f.workLog.report(f.a.log, applyErr)
	return nil
}

// apply converges discovery on the Secret's keyring and persists the
// result. No Secret, or one without a keyring, changes nothing: the keys
// from the flags or the ledger stay.
func (f *keyFollower) apply() error {
	obj, ok, err := f.store.GetByKey(f.ns + "/" + FederationSecret)
	if err != nil || !ok {
		return err
	}
	s, isSecret := obj.(*corev1.Secret)
	if !isSecret || len(s.Data[SecretKeyring]) == 0 {
		return nil
	}
	want, err := discovery.DecodeKeyring(s.Data[SecretKeyring])
	if err != nil {
		return fmt.Errorf("Secret %s, %q: %w", FederationSecret, SecretKeyring, err)
	}
	changed, err := applyKeyring(f.held, want)
	if changed {
		// Persist what is held, also after a partial change, so a restart
		// starts from it.
		ring, encErr := discovery.EncodeKeyring(f.held.Keys())
		if encErr == nil {
			encErr = f.ledger.PutKey(keyFederation, ring)
		}
		if encErr != nil {
			return errors.Join(err, fmt.Errorf("store the federation keyring: %w", encErr))
		}
		f.a.log.Info("federation keyring changed", "keys", agentapi.Fingerprints(f.held.Keys()))
	}
	if err != nil {
		return fmt.Errorf("Secret %s: %w", FederationSecret, err)
	}
	return nil
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// keyCollector exports the keys discovery holds, by fingerprint, read at
// each scrape so it cannot go stale.
type keyCollector struct{ held keyring }

var keyDesc = prometheus.NewDesc("flotilla_federation_key_info",
	"The federation keys this agent holds, by fingerprint (never the key); primary=\"true\" for the one that encrypts. Always 1.",
	[]string{"fingerprint", "primary"}, nil)

func (c keyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- keyDesc }

func (c keyCollector) Collect(ch chan<- prometheus.Metric) {
	for i, fp := range agentapi.Fingerprints(c.held.Keys()) {
		ch <- prometheus.MustNewConstMetric(keyDesc, prometheus.GaugeValue, 1, fp, fmt.Sprint(i == 0))
	}
}
