package peering

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// Scheme knows the flotilla.io types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// PeerObjects keeps the Peer objects of the local API server: it writes
// their status for the engine and reports their spec to it.
type PeerObjects struct {
	client client.Client
	cache  cache.Cache
	log    *slog.Logger

	// stopped is closed when the informer Watch started has returned,
	// with runErr; nil before.
	stopped chan struct{}
	runErr  error
}

// NewPeerObjects prepares a client and an informer for Peers.
func NewPeerObjects(cfg *rest.Config, log *slog.Logger) (*PeerObjects, error) {
	scheme := Scheme()
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("client for Peers: %w", err)
	}
	ca, err := cache.New(cfg, cache.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("cache for Peers: %w", err)
	}
	return &PeerObjects{client: c, cache: ca, log: log}, nil
}

// Watch reports every Peer's spec to e, and deletions, until ctx ends. It
// returns once the informer has synced; Wait waits for the informer.
func (o *PeerObjects) Watch(ctx context.Context, e *Engine) error {
	inf, err := o.cache.GetInformer(ctx, &v1alpha1.Peer{})
	if err != nil {
		return fmt.Errorf("watch Peers: %w", err)
	}
	report := func(obj any, exists bool) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		p, ok := obj.(*v1alpha1.Peer)
		if !ok {
			return
		}
		e.SpecChanged(p.Name, p.Spec.Networking, exists)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { report(obj, true) },
		UpdateFunc: func(_, obj any) { report(obj, true) },
		DeleteFunc: func(obj any) { report(obj, false) },
	}); err != nil {
		return fmt.Errorf("watch Peers: %w", err)
	}
	o.stopped = make(chan struct{})
	go func() {
		defer close(o.stopped)
		o.runErr = o.cache.Start(ctx)
	}()
	if !o.cache.WaitForCacheSync(ctx) {
		return fmt.Errorf("watch Peers: cache did not sync: %w", ctx.Err())
	}
	return nil
}

// Wait returns when the informer Watch started has stopped, with its
// error, or at once when Watch started none.
func (o *PeerObjects) Wait() error {
	if o.stopped == nil {
		return nil
	}
	<-o.stopped
	return o.runErr
}

// Write creates the Peer named id when missing and sets its status.
func (o *PeerObjects) Write(ctx context.Context, id, name string, status v1alpha1.PeerStatus) error {
	var p v1alpha1.Peer
	err := o.client.Get(ctx, client.ObjectKey{Name: id}, &p)
	if apierrors.IsNotFound(err) {
		p = v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: id, Labels: peerLabels(name)}}
		// Create fills p in with what the server stored.
		if err = o.client.Create(ctx, &p); err != nil {
			return fmt.Errorf("create Peer %s: %w", id, err)
		}
	} else if err != nil {
		return fmt.Errorf("read Peer %s: %w", id, err)
	}
	if want := peerLabels(name); p.Labels[v1alpha1.LabelClusterName] != want[v1alpha1.LabelClusterName] || p.Labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue {
		patch := client.MergeFrom(p.DeepCopy())
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		for k, v := range want {
			p.Labels[k] = v
		}
		if err := o.client.Patch(ctx, &p, patch); err != nil {
			return fmt.Errorf("label Peer %s: %w", id, err)
		}
	}
	status.ObservedGeneration = p.Generation
	p.Status = status
	if err := o.client.Status().Update(ctx, &p); err != nil {
		return fmt.Errorf("update status of Peer %s: %w", id, err)
	}
	return nil
}

var notLabel = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func peerLabels(name string) map[string]string {
	l := map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}
	v := strings.Trim(notLabel.ReplaceAllString(name, "-"), "-._")
	if len(v) > 63 {
		v = strings.Trim(v[:63], "-._")
	}
	if v != "" {
		l[v1alpha1.LabelClusterName] = v
	}
	return l
}
