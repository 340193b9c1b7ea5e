package harness

import (
	"errors"
	"fmt"
)

// Kill kills the node as a power cut would, all at once: its link to the
// node network goes down, and every process in its network namespace
// (containerd, kubelet, kube-proxy, host-network pods such as the agent),
// in its cgroups (its pods' containers) and among its containerd's shims
// gets SIGKILL. Nothing is drained, nothing is told: the Node stays in
// the API, NotReady once the control plane notices, its pods still bound
// to it, as after a real node dies. Stop, when the test ends, removes
// what is left without draining.
func (n *Node) Kill() error {
	if !n.killed.CompareAndSwap(false, true) {
		return nil
	}
	procs := []*Process{n.Containerd, n.Kubelet, n.KubeProxy, n.Flannel}
	for _, p := range procs {
		if p != nil {
			p.markStopped() // its exit is the test's doing, not a crash
		}
	}
	var errs []error
	if eth0, err := n.nl.LinkByName("eth0"); err != nil {
		errs = append(errs, fmt.Errorf("kill node %s: find eth0: %w", n.NodeName, err))
	} else if err := n.nl.LinkSetDown(eth0); err != nil {
		errs = append(errs, fmt.Errorf("kill node %s: take eth0 down: %w", n.NodeName, err))
	}
	killNetnsProcesses(n.Path)
	if err := killCgroup(n.cgroup); err != nil {
		errs = append(errs, fmt.Errorf("kill node %s: %w", n.NodeName, err))
	}
	n.killShims()
	for _, p := range procs {
		if p != nil {
			p.Kill() // reaped: the exit is waited for
		}
	}
	return errors.Join(errs...)
}

// Killed reports whether Kill was called.
func (n *Node) Killed() bool { return n.killed.Load() }
