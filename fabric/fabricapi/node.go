//go:build linux

package fabricapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/flotilla-io/flotilla/internal/kubeclient"

	"github.com/flotilla-io/flotilla/fabric"
)

// uninstallCheckTimeout bounds the question asked at exit: is the fabric
// being removed from the cluster?
const uninstallCheckTimeout = 5 * time.Second

// NodeConfig configures RunNode.
type NodeConfig struct {
	Client    kubeclient.Interface
	Namespace string // the agent's, where the plan is
	NodeName  string // this node's
	Fabric    fabric.Config
	Log       *slog.Logger
	// Applied, when set, is told the outcome of every apply (readiness).
	Applied func(error)
}

// RunNode applies this node's part of each plan the agent publishes until
// ctx ends. With no plan published it removes what the fabric made on the
// node; a plan it cannot read leaves the node as it is. A plan that
// follows a Lease (GatewayLease) is applied with the gateway on the node
// of the replica holding it, as soon as it holds it. At the end it
// removes the fabric from the node only if the fabric is being uninstalled
// (Uninstalling), so a restarted pod keeps traffic flowing.
func RunNode(ctx context.Context, cfg NodeConfig) error {
	if cfg.NodeName == "" || cfg.Namespace == "" {
		return errors.New("node name and namespace are required (NODE_NAME and POD_NAMESPACE from the downward API)")
	}
	f, err := fabric.New(cfg.Fabric)
	if err != nil {
		return err
	}
	var (
		mu     sync.Mutex
		latest Plan
		latErr error
		seen   bool
		holder string // of the Lease the plan follows
	)
	kick := make(chan struct{}, 1)
	kicked := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watchErr := make(chan error, 1)
	wg.Add(2)
	go func() {
		defer wg.Done()
		watchErr <- Watch(ctx, cfg.Client, cfg.Namespace, func(p Plan, err error) {
			mu.Lock()
			latest, latErr, seen = p, err, true
			mu.Unlock()
			kicked()
		})
	}()
	lease := leaseFollower{cfg: cfg, changed: func(h string) {
		mu.Lock()
		holder = h
		mu.Unlock()
		kicked()
	}}
	defer lease.follow(ctx, "")
	go func() {
		defer wg.Done()
		if err := f.Run(ctx); err != nil {
			cfg.Log.Error("fabric repair loop stopped", "err", err)
		}
	}()

	var lastErr string
	retry := retryMin
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return finish(f, cfg)
		case err := <-watchErr:
			if ctx.Err() == nil {
				return fmt.Errorf("watch the fabric plan: %v", err)
			}
			return finish(f, cfg)
		case <-kick:
		case <-timer:
		}
		timer = nil
		mu.Lock()
		plan, perr, ok := latest, latErr, seen
		mu.Unlock()
		if !ok {
			continue
		}
		if perr == nil {
			lease.follow(ctx, plan.GatewayLease)
			mu.Lock()
			h := holder
			mu.Unlock()
			plan = lease.gateway(plan, h)
		}
		err := applyPlan(f, cfg, plan, perr)
		if cfg.Applied != nil {
			cfg.Applied(err)
		}
		if err == nil {
			retry, lastErr = retryMin, ""
			continue
		}
		if err.Error() != lastErr {
			cfg.Log.Error("cannot apply the fabric plan; retrying", "err", err)
			lastErr = err.Error()
		}
		if !errors.Is(err, errUnusablePlan) {
			timer = time.After(retry)
			retry = min(2*retry, retryMax)
		}
	}
}

// leaseFollower watches the Lease a plan follows, while it follows one.
type leaseFollower struct {
	cfg     NodeConfig
	changed func(holder string) // "" when the Lease followed changes
	name    string              // the Lease watched; "" none
	stop    context.CancelFunc
	done    chan struct{}
	moved   string // the node the gateway was last moved to ahead of the plan
}

// follow watches the Lease name ("": none) instead of the one before.
func (l *leaseFollower) follow(ctx context.Context, name string) {
	if name == l.name {
		return
	}
	if l.stop != nil {
		l.stop()
		<-l.done
		l.stop, l.done = nil, nil
	}
	l.name = name
	l.changed("")
	if name == "" {
		return
	}
	watchCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	l.stop, l.done = stop, done
	go func() {
		defer close(done)
		if err := WatchLease(watchCtx, l.cfg.Client, l.cfg.Namespace, name, l.changed); err != nil {
			l.cfg.Log.Error("cannot follow the gateway's Lease; the plan alone moves the gateway", "err", err)
		}
	}()
}

// gateway is plan with the gateway on the Lease holder's node
// (Plan.WithGatewayOf), saying so once per move.
func (l *leaseFollower) gateway(plan Plan, holder string) Plan {
	moved, ok := plan.WithGatewayOf(holder)
	if !ok {
		l.moved = ""
		return plan
	}
	if moved.GatewayNode != l.moved {
		l.moved = moved.GatewayNode
		l.cfg.Log.Info("the gateway moved with the Lease, ahead of the plan", "gateway", moved.GatewayNode, "plan", plan.GatewayNode, "lease", plan.GatewayLease)
	}
	return moved
}

// errUnusablePlan marks a plan this node cannot read: waiting for the
// next one is all it can do.
var errUnusablePlan = errors.New("unusable fabric plan")

func applyPlan(f *fabric.Fabric, cfg NodeConfig, plan Plan, perr error) error {
	switch {
	case errors.Is(perr, ErrNoPlan):
		if err := f.Remove(); err != nil {
			return fmt.Errorf("no fabric plan published; remove the fabric from this node: %w", err)
		}
		cfg.Log.Info("no fabric plan published; nothing of the fabric on this node")
		return nil
	case perr != nil:
		return fmt.Errorf("%w: %v", errUnusablePlan, perr)
	}
	// Apply logs what it changed; a plan that changes nothing on this
	// node (another node's block) says nothing.
	return f.Apply(plan.For(cfg.NodeName))
}

// finish removes the fabric from the node when it is being uninstalled.
func finish(f *fabric.Fabric, cfg NodeConfig) error {
	ctx, cancel := context.WithTimeout(context.Background(), uninstallCheckTimeout)
	defer cancel()
	gone, err := Uninstalling(ctx, cfg.Client, cfg.Namespace)
	if err != nil {
		cfg.Log.Warn("cannot tell whether the fabric is being uninstalled; leaving the node's routes in place", "err", err)
		return nil
	}
	if !gone {
		cfg.Log.Info("stopping; the node's routes stay for the next fabric pod")
		return nil
	}
	if err := f.Remove(); err != nil {
		return fmt.Errorf("fabric uninstalled; remove it from this node: %w", err)
	}
	cfg.Log.Info("fabric uninstalled; removed it from this node")
	return nil
}

// For is the part of the plan the node named node applies. The gateway
// node sends what arrives from the tunnel to the node holding its
// destination; every other node routes the views to the gateway, its own
// traffic leaving with the first address of its pod block. Both exempt
// view traffic from a CNI's masquerade. Each learns its own
// address, from which the overlay (for nodes behind a router) derives its
// VXLAN address.
func (p Plan) For(node string) fabric.Desired {
	if node == p.GatewayNode {
		d := fabric.Desired{Role: fabric.Gateway, Addr: p.Gateway, Views: p.Views, TunnelInterface: p.TunnelInterface}
		for _, n := range p.Nodes {
			if blocks := slices.Concat(n.PodCIDRs, n.Blocks); n.Name != node && n.Addr.IsValid() && len(blocks) > 0 {
				d.Nodes = append(d.Nodes, fabric.Node{Addr: n.Addr, PodCIDRs: blocks})
			}
		}
		return d
	}
	d := fabric.Desired{Role: fabric.Worker, Gateway: p.Gateway, Views: p.Views, MTU: p.MTU}
	for _, n := range p.Nodes {
		if n.Name == node {
			d.Addr = n.Addr
			// The host's own traffic leaves with the first address of
			// the node's block (docs/fabric.md).
			if len(n.PodCIDRs) > 0 && n.PodCIDRs[0].Bits() <= 30 {
				d.HostSource = n.PodCIDRs[0].Addr().Next()
			}
		}
	}
	return d
}
