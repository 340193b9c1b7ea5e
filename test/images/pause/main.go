// Command pause is the sandbox process of the test nodes' pods: it holds
// the pod's namespaces, reaps orphans when it is the pod's init, and exits
// on SIGTERM or SIGINT. It stands in for registry.k8s.io/pause, which a
// machine without a registry cannot pull.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
