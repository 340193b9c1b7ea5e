package harness

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// KubeletOptions configure a pretend kubelet.
type KubeletOptions struct {
	// Site, when set, gives every pod a network namespace with its address
	// behind the site (a Pod of the harness), so traffic can be tested.
	Site *Site
	// PodCIDR is the node's pod range, used when the control plane does not
	// allocate one (ControlPlaneOptions.PodCIDR unset).
	PodCIDR netip.Prefix
	// Labels are added to the Node's, Taints are its spec.taints: a node
	// standing for another (a virtual node) is told apart by them.
	Labels map[string]string
	Taints []corev1.Taint
}

// Kubelet plays the kubelet of one Node: it registers the Node, keeps its
// lease fresh, marks pods bound to it Running with an address from the
// node's pod range, and confirms their deletion. No container runs.
type Kubelet struct {
	NodeName string
	cp       *ControlPlane
	opts     KubeletOptions
	podCIDR  netip.Prefix

	mu   sync.Mutex
	next netip.Addr // the first address never handed out
	// free are the addresses of deleted pods, oldest first: handed out
	// again once the range has been walked, as host-local IPAM does, so
	// that churn alone never exhausts a node's range.
	free  []netip.Addr
	ips   map[types.UID]netip.Addr
	netns map[types.UID]*Pod
	count int
}

// StartKubelet registers node name and runs its pretend kubelet until the
// test ends. It returns once the Node has a pod range.
func (cp *ControlPlane) StartKubelet(name string, opts KubeletOptions) *Kubelet {
	cp.env.t.Helper()
	k, err := cp.startKubelet(name, opts)
	if err != nil {
		cp.env.fatalf("kubelet %s on %s: %v", name, cp.Name, err)
	}
	return k
}

func (cp *ControlPlane) startKubelet(name string, opts KubeletOptions) (*Kubelet, error) {
	k := &Kubelet{NodeName: name, cp: cp, opts: opts, ips: map[types.UID]netip.Addr{}, netns: map[types.UID]*Pod{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	cp.env.t.Cleanup(func() { cancel(); wg.Wait() })
	if err := k.register(ctx); err != nil {
		return nil, err
	}
	wg.Add(2)
	go func() { defer wg.Done(); k.heartbeat(ctx) }()
	factory := informers.NewSharedInformerFactoryWithOptions(cp.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", name).String()
		}))
	queue := make(chan *corev1.Pod, 1024)
	factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { queue <- o.(*corev1.Pod) },
		UpdateFunc: func(_, o any) { queue <- o.(*corev1.Pod) },
		// A pod deleted at once (grace 0, or by the pod garbage
		// collector) is never seen terminating: its address is released
		// through the queue, after whatever sync of it is still there.
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if pod, ok := o.(*corev1.Pod); ok {
				gone := pod.DeepCopy()
				if gone.DeletionTimestamp == nil {
					gone.DeletionTimestamp = &metav1.Time{Time: time.Now()}
				}
				queue <- gone
			}
		},
	})
	factory.Start(ctx.Done())
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				factory.Shutdown()
				return
			case pod := <-queue:
				if err := k.sync(ctx, pod); err != nil && ctx.Err() == nil {
					cp.env.t.Logf("harness: kubelet %s: pod %s/%s: %v", name, pod.Namespace, pod.Name, err)
				}
			}
		}
	}()
	return k, nil
}

func (k *Kubelet) register(ctx context.Context) error {
	addr := "127.0.0.1"
	if k.opts.Site != nil {
		addr = k.opts.Site.Addr.String()
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("32Gi"),
		corev1.ResourcePods:   resource.MustParse("250"),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: k.NodeName, Labels: map[string]string{
			"kubernetes.io/hostname": k.NodeName, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		}},
		Spec: corev1.NodeSpec{Taints: k.opts.Taints},
		Status: corev1.NodeStatus{
			Capacity: capacity, Allocatable: capacity,
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}, {Type: corev1.NodeHostName, Address: k.NodeName}},
		},
	}
	for key, v := range k.opts.Labels {
		node.Labels[key] = v
	}
	if !k.cp.Options.PodCIDR.IsValid() && k.opts.PodCIDR.IsValid() {
		node.Spec.PodCIDR = k.opts.PodCIDR.String()
		node.Spec.PodCIDRs = []string{node.Spec.PodCIDR}
	}
	if _, err := k.cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("register node: %w", err)
	}
	k.cp.env.t.Cleanup(func() {
		k.cp.Client.CoreV1().Nodes().Delete(context.Background(), k.NodeName, metav1.DeleteOptions{})
	})
	// The controller manager may be writing the node's pod range meanwhile.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := k.cp.Client.CoreV1().Nodes().Get(ctx, k.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		current.Status = node.Status
		current.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "pretend kubelet of the flotilla test harness", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
		}}
		_, err = k.cp.Client.CoreV1().Nodes().UpdateStatus(ctx, current, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("node status: %w", err)
	}
	// The node's pod range comes from the controller manager, or from us.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := k.cp.Client.CoreV1().Nodes().Get(ctx, k.NodeName, metav1.GetOptions{})
		if err != nil || n.Spec.PodCIDR == "" {
			return false, nil
		}
		k.podCIDR, err = netip.ParsePrefix(n.Spec.PodCIDR)
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("node %s got no pod range (set ControlPlaneOptions.PodCIDR or KubeletOptions.PodCIDR): %w", k.NodeName, err)
	}
	k.next = k.podCIDR.Addr().Next() // .0 is the network; pods start at .1
	return nil
}

// PodCIDR returns the node's pod range.
func (k *Kubelet) PodCIDR() netip.Prefix { return k.podCIDR }

// heartbeat renews the node's lease so the node lifecycle controller keeps
// the node Ready.
func (k *Kubelet) heartbeat(ctx context.Context) {
	leases := k.cp.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	seconds := int32(40)
	for {
		now := metav1.NewMicroTime(time.Now())
		lease, err := leases.Get(ctx, k.NodeName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: k.NodeName},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: &k.NodeName, LeaseDurationSeconds: &seconds, RenewTime: &now},
			}, metav1.CreateOptions{})
		case err == nil:
			lease.Spec.RenewTime = &now
			_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		}
		if err != nil && ctx.Err() == nil {
			k.cp.env.t.Logf("harness: kubelet %s: renew lease: %v", k.NodeName, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Second):
		}
	}
}

// sync brings one pod to Running, or finishes its deletion.
func (k *Kubelet) sync(ctx context.Context, pod *corev1.Pod) error {
	pods := k.cp.Client.CoreV1().Pods(pod.Namespace)
	if pod.DeletionTimestamp != nil {
		k.release(pod.UID)
		err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	if pod.Status.Phase == corev1.PodRunning {
		return nil
	}
	ip, err := k.assign(pod)
	if err != nil {
		return err
	}
	now := metav1.Now()
	st := pod.DeepCopy()
	st.Status.Phase = corev1.PodRunning
	st.Status.HostIP = "127.0.0.1"
	if k.opts.Site != nil {
		st.Status.HostIP = k.opts.Site.Addr.String()
	}
	st.Status.HostIPs = []corev1.HostIP{{IP: st.Status.HostIP}}
	st.Status.PodIP = ip.String()
	st.Status.PodIPs = []corev1.PodIP{{IP: ip.String()}}
	st.Status.StartTime = &now
	st.Status.Conditions = nil
	for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		st.Status.Conditions = append(st.Status.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	st.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		st.Status.ContainerStatuses = append(st.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: new(bool),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
		*st.Status.ContainerStatuses[len(st.Status.ContainerStatuses)-1].Started = true
	}
	_, err = pods.UpdateStatus(ctx, st, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // a newer version is on its way through the informer
	}
	return err
}

// assign gives a pod its address (and network namespace) once.
func (k *Kubelet) assign(pod *corev1.Pod) (netip.Addr, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ip, ok := k.ips[pod.UID]; ok {
		return ip, nil
	}
	if pod.Spec.HostNetwork {
		addr := netip.MustParseAddr("127.0.0.1")
		if k.opts.Site != nil {
			addr = k.opts.Site.Addr
		}
		k.ips[pod.UID] = addr
		return addr, nil
	}
	ip := k.next
	switch {
	case k.podCIDR.Contains(ip):
		k.next = ip.Next()
	case len(k.free) > 0:
		ip, k.free = k.free[0], k.free[1:]
	default:
		return netip.Addr{}, fmt.Errorf("pod range %s of node %s is exhausted", k.podCIDR, k.NodeName)
	}
	if k.opts.Site != nil {
		k.count++
		p, err := k.opts.Site.addPod(fmt.Sprintf("k%d", k.count), ip)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("network namespace for %s: %w", pod.Name, err)
		}
		k.netns[pod.UID] = p
	}
	k.ips[pod.UID] = ip
	return ip, nil
}

// release forgets a deleted pod, removes its network namespace and
// frees its address.
func (k *Kubelet) release(uid types.UID) {
	k.mu.Lock()
	p := k.netns[uid]
	delete(k.netns, uid)
	// A host network pod's address is the node's, not the range's.
	if ip, ok := k.ips[uid]; ok && k.podCIDR.Contains(ip) {
		k.free = append(k.free, ip)
	}
	delete(k.ips, uid)
	k.mu.Unlock()
	if p != nil {
		p.Delete()
	}
}

// PodNetns returns the network namespace of a running pod, when the
// kubelet has a site.
func (k *Kubelet) PodNetns(uid types.UID) (*Pod, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.netns[uid]
	return p, ok
}
