package reflection

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/apiauth"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/offload"
)

// retryForbidden is how soon a namespace whose ConfigMaps and Secrets
// this agent may not read is looked at again: its RoleBinding may be made
// at any time, and nothing tells the agent when.
const retryForbidden = 10 * time.Second

// The answers of the agent's SelfSubjectAccessReviews about a namespace
// are kept for a while, so that a burst of NamespaceOffload changes costs
// one round of reviews, not one each: a yes for rightsTTL, a no for
// refusedRightsTTL (a binding just made works soon). A watch refused
// drops the namespace's answer at once. Watching RoleBindings instead
// would take the right to list them in every namespace.
const (
	rightsTTL        = 10 * time.Second
	refusedRightsTTL = 5 * time.Second
	// rightsCacheSize bounds the answers: one per offloaded namespace.
	rightsCacheSize = 4096
)

// offloadedObjects holds the ConfigMaps and Secrets of the offloaded
// namespaces, a cache per namespace: the agent may read them only where a
// RoleBinding grants it offload.ReflectionClusterRole (docs/services.md,
// "Reflection's rights"), and holds none of any other namespace. A cache
// starts once its namespace is ready on a provider and the agent may read
// there, and stops when the offloading goes or a read is refused.
type offloadedObjects struct {
	r        *Reflector
	config   *rest.Config
	reviews  authorizationv1client.SelfSubjectAccessReviewInterface
	identity authenticationv1client.SelfSubjectReviewInterface
	ctrl     *ctrl.Controller[string] // keys: local namespaces
	// rights are the reviews' answers by namespace: what is refused, ""
	// when nothing is.
	rights *apiauth.Cache[string, string]

	mu     sync.Mutex
	spaces map[string]*namespaceObjects
	// user is who this agent is to its API server, for the message that
	// says what to bind; "" until known.
	user string
}

// namespaceObjects is one offloaded namespace's: its cache, or why there
// is none.
type namespaceObjects struct {
	cache *localCache // nil while forbidden
	// forbidden says what was refused; "" while the agent may read.
	forbidden string
}

// localCache watches the ConfigMaps and Secrets of one namespace.
type localCache struct {
	cache.Cache
	synced atomic.Bool
	// refused is set when a list or watch was refused after the cache
	// started (the RoleBinding removed): its reconcile stops it.
	refused atomic.Bool
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

func newOffloadedObjects(r *Reflector, cfg *rest.Config) (*offloadedObjects, error) {
	authz, err := authorizationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	authn, err := authenticationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	reviews := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flotilla_reflection_rights_cache_total",
		Help: "Whether this agent may read an offloaded namespace's ConfigMaps and Secrets, by result: hit (answered from the cache), miss (asked the API server).",
	}, []string{"result"})
	if err := ctrl.Register(r.cfg.Metrics, reviews); err != nil {
		return nil, err
	}
	o := &offloadedObjects{r: r, config: cfg, reviews: authz.SelfSubjectAccessReviews(), identity: authn.SelfSubjectReviews(),
		spaces: map[string]*namespaceObjects{},
		rights: apiauth.NewCache[string, string](apiauth.CacheConfig{TTL: rightsTTL, RefusedTTL: refusedRightsTTL, Size: rightsCacheSize,
			Hits: reviews.WithLabelValues("hit"), Misses: reviews.WithLabelValues("miss")})}
	o.ctrl, err = ctrl.New(ctrl.Config[string]{
		Name: "reflection_namespaces", MaxDelay: 30 * time.Second, Reconcile: o.reconcile, Metrics: r.cfg.Metrics,
		Errors: &ctrl.ErrorLog[string]{Logger: r.log, Failed: "ConfigMaps and Secrets not watched; retrying",
			Recovered: "ConfigMaps and Secrets watched again", Attrs: ctrl.Named[string]("namespace")},
	})
	if err != nil {
		return nil, err
	}
	return o, nil
}

// run reconciles namespaces until ctx ends, then stops every cache.
func (o *offloadedObjects) run(ctx context.Context) error {
	defer o.stopAll()
	user := o.whoAmI(ctx)
	o.mu.Lock()
	o.user = user
	o.mu.Unlock()
	return o.ctrl.Run(ctx, nil)
}

// offloadChanged queues namespace ns, whose NamespaceOffloads changed.
func (o *offloadedObjects) offloadChanged(ns string) { o.ctrl.Add(ns) }

// reconcile keeps namespace ns's cache running while it is offloaded and
// readable, and says why not when it is not readable.
func (o *offloadedObjects) reconcile(ctx context.Context, ns string) (time.Duration, error) {
	offloaded, err := o.offloaded(ctx, ns)
	if err != nil {
		return 0, err
	}
	o.mu.Lock()
	st := o.spaces[ns]
	o.mu.Unlock()
	if !offloaded {
		o.rights.Forget(ns)
		if st != nil {
			o.remove(ns, st)
		}
		return 0, nil
	}
	refused, err := o.refused(ctx, ns)
	if err != nil {
		return 0, err
	}
	running := st != nil && st.cache != nil
	if running && refused == "" && !st.cache.refused.Load() {
		return o.r.cfg.RecheckRights, nil
	}
	if running {
		// Refused since it started (the RoleBinding removed): what it
		// holds goes, unread, and what was reflected stays as it is.
		if refused == "" {
			refused = "list or watch configmaps or secrets (its watch was refused)"
		}
		o.set(ns, &namespaceObjects{forbidden: refused})
		st.cache.stop()
		return retryForbidden, nil
	}
	if refused != "" {
		o.set(ns, &namespaceObjects{forbidden: refused})
		return retryForbidden, nil
	}
	lc, err := o.start(ns)
	if err != nil {
		return 0, err
	}
	o.set(ns, &namespaceObjects{cache: lc})
	return o.r.cfg.RecheckRights, nil
}

// offloaded reports whether ns has a NamespaceOffload not being deleted
// whose namespace is ready on at least one provider. Before that there
// is nowhere to reflect to, and nothing is read or asked (the rights'
// reviews would compete with the requests that make the namespace on the
// providers); once it is deleted, its namespaces on the providers go
// with what was reflected there, and nothing more is read.
func (o *offloadedObjects) offloaded(ctx context.Context, ns string) (bool, error) {
	var list v1alpha1.NamespaceOffloadList
	if err := o.r.local.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return false, fmt.Errorf("list NamespaceOffloads in %s: %w", ns, err)
	}
	acting := offload.ActingOffload(list.Items)
	if acting == nil {
		return false, nil
	}
	for _, c := range acting.Status.Clusters {
		if _, ready := offload.MirroredNamespace(acting, c.ClusterID); ready {
			return true, nil
		}
	}
	return false, nil
}

// refused says what of listing and watching the ConfigMaps and Secrets
// of ns this agent may not, "" when it may do all of it: the API
// server's answer, or the cache's while fresh.
func (o *offloadedObjects) refused(ctx context.Context, ns string) (string, error) {
	return o.rights.Get(ctx, ns, func(ctx context.Context) (string, bool, error) {
		refused, err := o.review(ctx, ns)
		return refused, refused == "", err
	})
}

// review asks the API server whether this agent may list and watch the
// ConfigMaps and Secrets of ns; it returns what it may not.
func (o *offloadedObjects) review(ctx context.Context, ns string) (string, error) {
	var denied []string
	for _, resource := range []string{"configmaps", "secrets"} {
		for _, verb := range []string{"list", "watch"} {
			review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Resource: resource},
			}}
			res, err := o.reviews.Create(ctx, review, metav1.CreateOptions{})
			if err != nil {
				return "", fmt.Errorf("may this agent %s %s in %s: %w", verb, resource, ns, err)
			}
			if !res.Status.Allowed {
				denied = append(denied, verb+" "+resource)
			}
		}
	}
	return strings.Join(denied, ", "), nil
}

// start starts the cache of namespace ns.
func (o *offloadedObjects) start(ns string) (*localCache, error) {
	lc := &localCache{}
	c, err := cache.New(o.config, cache.Options{
		Scheme: reflectScheme(), Mapper: reflectMapper(),
		DefaultNamespaces: map[string]cache.Config{ns: {}},
		DefaultTransform:  cache.TransformStripManagedFields(),
		// Refused (the RoleBinding removed): the namespace's reconcile
		// drops the cache and asks again.
		DefaultWatchErrorHandler: func(ctx context.Context, r *toolscache.Reflector, err error) {
			if apierrors.IsForbidden(err) {
				if !lc.refused.Swap(true) {
					o.rights.Forget(ns)
					o.ctrl.Add(ns)
				}
				return
			}
			toolscache.DefaultWatchErrorHandler(ctx, r, err)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("cache of ConfigMaps and Secrets in %s: %w", ns, err)
	}
	lc.Cache = c
	ctx, cancel := context.WithCancel(context.Background())
	lc.cancel = cancel
	regs, err := ctrl.AddWatches(ctx, c, "reflection in "+ns,
		ctrl.On(&corev1.ConfigMap{}, ctrl.OnEvery(func(obj any) { o.r.localChanged(kindConfigMap, obj) })),
		ctrl.On(&corev1.Secret{}, ctrl.OnEvery(func(obj any) { o.r.localChanged(kindSecret, obj) })),
	)
	if err != nil {
		cancel()
		return nil, err
	}
	lc.done.Go(func() {
		if err := c.Start(ctx); err != nil && ctx.Err() == nil {
			o.r.log.Warn("watch of ConfigMaps and Secrets stopped", "namespace", ns, "err", err)
		}
	})
	lc.done.Go(func() {
		if !toolscache.WaitForCacheSync(ctx.Done(), regs[0].HasSynced, regs[1].HasSynced) {
			return
		}
		lc.synced.Store(true)
		// Reconciles before now could not read the namespace and left
		// its reflections as they were.
		for id := range o.r.providers.Snapshot() {
			o.r.queueNamespace(id, ns)
		}
	})
	return lc, nil
}

func (lc *localCache) stop() {
	lc.cancel()
	lc.done.Wait()
}

// set records ns's state and, when whether it is forbidden changed,
// queues its Reflected condition on every provider.
func (o *offloadedObjects) set(ns string, st *namespaceObjects) {
	o.mu.Lock()
	old := o.spaces[ns]
	o.spaces[ns] = st
	o.mu.Unlock()
	if old == nil || old.forbidden != st.forbidden {
		if st.forbidden != "" {
			o.r.log.Warn("may not read ConfigMaps and Secrets: not reflected", "namespace", ns, "refused", st.forbidden,
				"bind", offload.ReflectionBinding)
		}
		o.r.queueStatus(ns)
	}
}

// remove stops ns's cache, its offloading gone.
func (o *offloadedObjects) remove(ns string, st *namespaceObjects) {
	if st.cache != nil {
		st.cache.stop()
	}
	o.mu.Lock()
	if o.spaces[ns] == st {
		delete(o.spaces, ns)
	}
	o.mu.Unlock()
}

func (o *offloadedObjects) stopAll() {
	o.mu.Lock()
	all := o.spaces
	o.spaces = map[string]*namespaceObjects{}
	o.mu.Unlock()
	for _, st := range all {
		if st.cache != nil {
			st.cache.stop()
		}
	}
}

// reader is the cache of ns once it has listed; offload.ErrNotListed
// before, while forbidden or when ns is not offloaded: its reflections
// stay as they are, and it is queued again once listed.
func (o *offloadedObjects) reader(ns string) (client.Reader, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	st := o.spaces[ns]
	if st == nil || st.cache == nil || !st.cache.synced.Load() || st.cache.refused.Load() {
		return nil, offload.ErrNotListed
	}
	return st.cache, nil
}

// Get reads a ConfigMap or Secret of an offloaded namespace.
func (o *offloadedObjects) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	rd, err := o.reader(key.Namespace)
	if err != nil {
		return err
	}
	return rd.Get(ctx, key, obj, opts...)
}

// List lists the ConfigMaps or Secrets of offloaded namespace ns.
func (o *offloadedObjects) List(ctx context.Context, list client.ObjectList, ns string) error {
	rd, err := o.reader(ns)
	if err != nil {
		return err
	}
	return rd.List(ctx, list, client.InNamespace(ns))
}

// forbidden is what the agent may not do in ns, "" when nothing is
// refused (or ns is not known to be offloaded).
func (o *offloadedObjects) forbidden(ns string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if st := o.spaces[ns]; st != nil {
		return st.forbidden
	}
	return ""
}

// whoAmI is the user this agent is to its API server; "" when it cannot
// tell (the message then names no account).
func (o *offloadedObjects) whoAmI(ctx context.Context) string {
	res, err := o.identity.Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		o.r.log.Debug("who this agent is to its API server: not known", "err", err)
		return ""
	}
	return res.Status.UserInfo.Username
}

// forbiddenMessage is the Reflected condition's message when the agent
// may not read ns: what is missing and how to make it.
func (o *offloadedObjects) forbiddenMessage(ns, remoteNS, provider, refused string) string {
	o.mu.Lock()
	user := o.user
	o.mu.Unlock()
	subject, flag := "this agent's account", "--serviceaccount "+offload.AgentServiceAccount
	if sa, ok := strings.CutPrefix(user, "system:serviceaccount:"); ok {
		subject, flag = "ServiceAccount "+strings.Replace(sa, ":", "/", 1), "--serviceaccount "+sa
	} else if user != "" {
		subject, flag = "user "+user, "--user "+user
	}
	return fmt.Sprintf("ConfigMaps and Secrets of %s are not reflected to namespace %s on %s: this agent may not %s there (Forbidden). "+
		"RoleBinding %s in %s must bind ClusterRole %s to %s: `flotilla offload namespace %s` makes it, or "+
		"`kubectl -n %s create rolebinding %s --clusterrole %s %s`",
		ns, remoteNS, provider, refused, offload.ReflectionBinding, ns, offload.ReflectionClusterRole, subject, ns,
		ns, offload.ReflectionBinding, offload.ReflectionClusterRole, flag)
}
