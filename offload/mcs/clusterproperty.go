package mcs

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/flotilla-io/flotilla/api/about/v1alpha1"
)

// ClusterProperties writes KEP-2149's ClusterProperties of this cluster:
// cluster.clusterset.k8s.io its cluster ID, clusterset.k8s.io the
// clusterset's name. A property someone else wrote with another value is
// left alone and logged: the KEP makes the cluster ID immutable while the
// cluster is in a clusterset, so overwriting it would break whoever set
// it.
type ClusterProperties struct {
	c       client.Client
	values  map[string]string
	log     *slog.Logger
	every   time.Duration
	refused map[string]string
}

// NewClusterProperties prepares the writer of clusterID and clusterSet.
func NewClusterProperties(cfg *rest.Config, clusterID, clusterSet string, log *slog.Logger) (*ClusterProperties, error) {
	s := runtime.NewScheme()
	if err := aboutv1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	m := meta.NewDefaultRESTMapper(nil)
	m.Add(aboutv1alpha1.GroupVersion.WithKind("ClusterProperty"), meta.RESTScopeRoot)
	c, err := client.New(cfg, client.Options{Scheme: s, Mapper: m})
	if err != nil {
		return nil, fmt.Errorf("cluster properties: client: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &ClusterProperties{c: c, values: map[string]string{ClusterIDProperty: clusterID, ClusterSetProperty: clusterSet},
		log: log.With("component", "cluster properties"), every: time.Minute, refused: map[string]string{}}, nil
}

// Run writes the properties at once, again after a failure (the CRD may
// not be established yet) and every minute after, so that one deleted
// comes back.
func (p *ClusterProperties) Run(ctx context.Context) error {
	wait := 100 * time.Millisecond
	for {
		next := p.every
		if err := p.Ensure(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			p.log.Warn("cluster properties not written; retrying", "err", err)
			next, wait = wait, min(2*wait, p.every)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(next):
		}
	}
}

// Ensure writes each property that is missing or ours with another value.
func (p *ClusterProperties) Ensure(ctx context.Context) error {
	for name, value := range p.values {
		var cp aboutv1alpha1.ClusterProperty
		err := p.c.Get(ctx, client.ObjectKey{Name: name}, &cp)
		switch {
		case apierrors.IsNotFound(err):
			cp = aboutv1alpha1.ClusterProperty{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelManagedBy: ManagedBy}},
				Spec:       aboutv1alpha1.ClusterPropertySpec{Value: value},
			}
			if err := p.c.Create(ctx, &cp); err != nil {
				return fmt.Errorf("create ClusterProperty %s: %w", name, err)
			}
			p.log.Info("cluster property written", "name", name, "value", value)
		case err != nil:
			return fmt.Errorf("read ClusterProperty %s: %w", name, err)
		case cp.Spec.Value == value:
		case cp.Labels[LabelManagedBy] != ManagedBy:
			if p.refused[name] != cp.Spec.Value {
				p.refused[name] = cp.Spec.Value
				p.log.Warn("a ClusterProperty written by someone else holds another value; it is left alone",
					"name", name, "value", cp.Spec.Value, "ours", value)
			}
		default:
			cp.Spec.Value = value
			if err := p.c.Update(ctx, &cp); err != nil {
				return fmt.Errorf("update ClusterProperty %s: %w", name, err)
			}
		}
	}
	return nil
}
