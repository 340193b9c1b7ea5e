package tenancy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/offload"
)

// Fences proves, with the agent's own credential, that the admission
// policies confining the agent and its consumers are in force: each
// policy deploy/ installs is there with a binding that denies, and
// requests the agent's RBAC allows but the policies must refuse are
// refused (server-side dry runs: nothing is written). A provider grants
// nothing until they are proven (Grants), and stops issuing credentials
// when a later check fails: without its fences a compromised agent, or a
// consumer, reaches much more than the grant says (docs/security.md).
type Fences struct {
	cfg FencesConfig
	log *slog.Logger
	m   *fenceMetrics

	checked   chan struct{} // closed by the first check's verdict
	checkOnce sync.Once

	mu  sync.Mutex
	err error // the last check's verdict
}

// FencesConfig is what Fences needs.
type FencesConfig struct {
	// Client carries the agent's own credential: the policies match its
	// account, so an administrator's credential proves nothing.
	Client kubeclient.Interface
	// Bindings are the ValidatingAdmissionPolicyBindings deploy/
	// installs (deploy.AdmissionBindings): each must be there as shipped,
	// its policy with it.
	Bindings []admissionregistrationv1.ValidatingAdmissionPolicyBinding
	// Interval between checks once proven (default 5 minutes); a failed
	// check is repeated sooner, from half a second up to Retry (default 10
	// seconds): policies just applied take a moment to be enforced.
	Interval, Retry time.Duration
	// Changed, when set, is told when the verdict changes.
	Changed func(err error)

	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// errNotChecked is the verdict before the first check.
var errNotChecked = errors.New("the admission policies have not been checked yet")

// NewFences checks cfg; Run starts the checks.
func NewFences(cfg FencesConfig) (*Fences, error) {
	if cfg.Client == nil || len(cfg.Bindings) == 0 {
		return nil, errors.New("fences: a client and the policies' bindings are required")
	}
	if cfg.Interval == 0 {
		cfg.Interval = 5 * time.Minute
	}
	if cfg.Retry == 0 {
		cfg.Retry = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	f := &Fences{cfg: cfg, log: cfg.Logger.With("component", "fences"), err: errNotChecked, checked: make(chan struct{})}
	var err error
	if f.m, err = newFenceMetrics(cfg.Metrics); err != nil {
		return nil, fmt.Errorf("fences: metrics: %w", err)
	}
	return f, nil
}

// Enforced is nil when the last check proved every fence, or says what
// is missing.
func (f *Fences) Enforced() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Checked is closed once the first check has a verdict.
func (f *Fences) Checked() <-chan struct{} { return f.checked }

// Run checks at once, then every Interval (sooner while a check fails)
// and whenever a policy or binding changes, until ctx ends.
func (f *Fences) Run(ctx context.Context) error {
	changed := make(chan struct{}, 1)
	var watches sync.WaitGroup
	defer watches.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rc := f.cfg.Client.AdmissionregistrationV1().RESTClient()
	for _, resource := range []struct {
		name string
		obj  runtime.Object
	}{
		{"validatingadmissionpolicies", &admissionregistrationv1.ValidatingAdmissionPolicy{}},
		{"validatingadmissionpolicybindings", &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}},
	} {
		inf := toolscache.NewSharedIndexInformer(toolscache.NewListWatchFromClient(rc, resource.name, "", fields.Everything()), resource.obj, 0, toolscache.Indexers{})
		// Only that something changed matters (the check lists afresh):
		// the cache keeps names.
		if err := inf.SetTransform(namesOnly); err != nil {
			return err
		}
		poke := func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerDetailedFuncs{
			AddFunc:    func(_ any, initial bool) { poke() },
			UpdateFunc: func(_, _ any) { poke() },
			DeleteFunc: func(any) { poke() },
		}); err != nil {
			return err
		}
		watches.Go(func() { inf.RunWithContext(ctx) })
	}
	retry := 500 * time.Millisecond
	for {
		err := f.Check(ctx)
		if ctx.Err() != nil {
			return nil
		}
		wait := f.cfg.Interval
		if err != nil {
			wait, retry = retry, min(2*retry, f.cfg.Retry)
		} else {
			retry = 500 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-time.After(wait):
		}
	}
}

func namesOnly(obj any) (any, error) {
	if o, ok := obj.(metav1.Object); ok {
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: o.GetName(), ResourceVersion: o.GetResourceVersion()}}, nil
	}
	return obj, nil
}

// Check checks once and keeps the verdict.
func (f *Fences) Check(ctx context.Context) error {
	err := f.check(ctx)
	if ctx.Err() != nil {
		return err
	}
	f.mu.Lock()
	prev := f.err
	f.err = err
	f.mu.Unlock()
	f.checkOnce.Do(func() { close(f.checked) })
	if err != nil {
		f.m.enforced.Set(0)
	} else {
		f.m.enforced.Set(1)
	}
	f.m.checks.Inc()
	if (prev == nil) != (err == nil) || (err != nil && prev.Error() != err.Error()) {
		if err != nil {
			f.log.Error("admission policies not in force: granting nothing until they are", "err", err)
		} else {
			f.log.Info("admission policies in force")
		}
		if f.cfg.Changed != nil {
			f.cfg.Changed(err)
		}
	}
	return err
}

func (f *Fences) check(ctx context.Context) error {
	if err := f.installed(ctx); err != nil {
		return err
	}
	var errs []error
	for _, p := range probes {
		if err := p.refused(ctx, f.cfg.Client); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// installed checks that every binding deploy/ ships is there as shipped,
// denying, and its policy with it, failing closed.
func (f *Fences) installed(ctx context.Context) error {
	ar := f.cfg.Client.AdmissionregistrationV1()
	policies, err := ar.ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return errors.New("the API server does not serve ValidatingAdmissionPolicies (admissionregistration.k8s.io/v1, Kubernetes 1.30 or later)")
	}
	if err != nil {
		return fmt.Errorf("list ValidatingAdmissionPolicies: %w", err)
	}
	bindings, err := ar.ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list ValidatingAdmissionPolicyBindings: %w", err)
	}
	var errs []error
	for _, want := range f.cfg.Bindings {
		name, policy := want.Name, want.Spec.PolicyName
		i := slices.IndexFunc(policies.Items, func(p admissionregistrationv1.ValidatingAdmissionPolicy) bool { return p.Name == policy })
		if i < 0 {
			errs = append(errs, fmt.Errorf("ValidatingAdmissionPolicy %s is missing (kubectl apply --server-side -k deploy/)", policy))
			continue
		}
		if fp := policies.Items[i].Spec.FailurePolicy; fp != nil && *fp != admissionregistrationv1.Fail {
			errs = append(errs, fmt.Errorf("ValidatingAdmissionPolicy %s has failurePolicy %s, want Fail", policy, *fp))
		}
		j := slices.IndexFunc(bindings.Items, func(b admissionregistrationv1.ValidatingAdmissionPolicyBinding) bool { return b.Name == name })
		if j < 0 {
			errs = append(errs, fmt.Errorf("ValidatingAdmissionPolicyBinding %s is missing (kubectl apply --server-side -k deploy/)", name))
			continue
		}
		got := bindings.Items[j].Spec
		switch {
		case got.PolicyName != policy:
			errs = append(errs, fmt.Errorf("ValidatingAdmissionPolicyBinding %s binds policy %q, want %s", name, got.PolicyName, policy))
		case !slices.Contains(got.ValidationActions, admissionregistrationv1.Deny):
			errs = append(errs, fmt.Errorf("ValidatingAdmissionPolicyBinding %s does not deny (validationActions %v)", name, got.ValidationActions))
		case !apiequality.Semantic.DeepEqual(got.ParamRef, want.Spec.ParamRef),
			want.Spec.MatchResources == nil && got.MatchResources != nil:
			// A binding narrowed, or pointed at other parameters, fences
			// less than the policy says.
			errs = append(errs, fmt.Errorf("ValidatingAdmissionPolicyBinding %s is not as deploy/ ships it (paramRef or matchResources changed)", name))
		}
	}
	return errors.Join(errs...)
}

// probe is a request the agent's RBAC allows and a policy must refuse.
type probe struct {
	what, policy string
	do           func(ctx context.Context, c kubeclient.Interface, dry metav1.CreateOptions) error
}

// probeName names what the probes would create, probeConsumer the tenant
// they would make; dry runs write nothing.
const (
	probeName     = "flotilla-fence-probe"
	probeConsumer = "fenceprobe"
)

var probes = []probe{
	{"create a namespace that is not a tenant", "flotilla-agent-namespaces",
		func(ctx context.Context, c kubeclient.Interface, dry metav1.CreateOptions) error {
			_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: probeName}}, dry)
			return err
		}},
	{"label a namespace into its placement webhook (" + offload.LabelOffloaded + ")", "flotilla-agent-offloaded-label",
		func(ctx context.Context, c kubeclient.Interface, dry metav1.CreateOptions) error {
			// A tenant namespace, which the agent may create, but
			// labelled as only an administrator may label one.
			l := offload.TenantLabels(probeConsumer)
			l[LabelPodSecurityEnforce] = PodSecurityRestricted
			l[offload.LabelOffloaded] = "true"
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: offload.TenantNamespace(probeConsumer), Labels: l}}
			_, err := c.CoreV1().Namespaces().Create(ctx, ns, dry)
			return err
		}},
	{"create a Secret in default", "flotilla-agent-tenant-objects",
		func(ctx context.Context, c kubeclient.Interface, dry metav1.CreateOptions) error {
			_, err := c.CoreV1().Secrets(metav1.NamespaceDefault).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: probeName}}, dry)
			return err
		}},
}

// refused is nil when the policy refused the dry run.
func (p probe) refused(ctx context.Context, c kubeclient.Interface) error {
	err := p.do(ctx, c, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		return fmt.Errorf("the agent may %s (a dry run was allowed): ValidatingAdmissionPolicy %s is not enforced", p.what, p.policy)
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+p.policy+"'"):
		return nil
	case apierrors.IsForbidden(err):
		return fmt.Errorf("a dry run to %s was refused, but not by ValidatingAdmissionPolicy %s: %w", p.what, p.policy, err)
	}
	return fmt.Errorf("a dry run to %s: %w", p.what, err)
}

type fenceMetrics struct {
	enforced prometheus.Gauge
	checks   prometheus.Counter
}

func newFenceMetrics(reg prometheus.Registerer) (*fenceMetrics, error) {
	m := &fenceMetrics{
		enforced: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flotilla_fences_enforced", Help: "1 when the last check proved the admission policies in force; 0 when it did not (nothing is granted)."}),
		checks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flotilla_fences_checks_total", Help: "Checks of the admission policies."}),
	}
	return m, ctrl.Register(reg, m.enforced, m.checks)
}

// ProbedPolicies are the policies the dry runs prove enforced.
func ProbedPolicies() []string {
	names := make([]string, len(probes))
	for i, p := range probes {
		names[i] = p.policy
	}
	return names
}
