package agent

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
)

// checks holds named readiness checks. A component registers one when it
// starts; /readyz passes when every check passes.
type checks struct {
	mu     sync.RWMutex
	checks map[string]func() error
}

func (c *checks) add(name string, check func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.checks == nil {
		c.checks = map[string]func() error{}
	}
	c.checks[name] = check
}

// run returns one line per check, sorted, and whether all passed.
func (c *checks) run() ([]string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	names := make([]string, 0, len(c.checks))
	for n := range c.checks {
		names = append(names, n)
	}
	sort.Strings(names)
	ok := len(names) > 0 // nothing registered yet: still starting
	lines := make([]string, 0, len(names))
	for _, n := range names {
		if err := c.checks[n](); err != nil {
			ok = false
			lines = append(lines, fmt.Sprintf("[-]%s failed: %v", n, err))
		} else {
			lines = append(lines, fmt.Sprintf("[+]%s ok", n))
		}
	}
	return lines, ok
}

// serveReadyz answers like kube-apiserver's /readyz: "ok", or 503 with the
// failing checks; ?verbose lists every check.
func (c *checks) serveReadyz(w http.ResponseWriter, r *http.Request) {
	lines, ok := c.run()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		if len(lines) == 0 {
			lines = []string{"[-]agent starting"}
		}
		fmt.Fprintln(w, strings.Join(lines, "\n"))
		fmt.Fprintln(w, "readyz check failed")
		return
	}
	if _, verbose := r.URL.Query()["verbose"]; verbose {
		fmt.Fprintln(w, strings.Join(lines, "\n"))
		fmt.Fprintln(w, "readyz check passed")
		return
	}
	fmt.Fprint(w, "ok")
}
