package e2e

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/test/federation"
)

// agentLog keeps every line the agent containers of a cluster write
// while a test runs, those of pods deleted since too (their logs go with
// them), so that a failure can print what every replica said around it.
type agentLog struct {
	c *federation.NodeCluster

	mu       sync.Mutex
	lines    []agentLine
	followed map[string]bool // container IDs streamed already
}

// agentLine is one line of an agent container's log, with whose it is.
type agentLine struct {
	pod, node string
	logLine
}

// recordAgentLogs starts keeping c's agent lines (agentLog) until the
// test ends: an informer of the agent pods starts a stream for each
// agent container as it runs.
func recordAgentLogs(t testing.TB, c *federation.NodeCluster) *agentLog {
	l := &agentLog{c: c, followed: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	inf := kubeclient.NewInformer(&corev1.Pod{}, c.CP.Client.CoreV1().Pods(federation.AgentNamespace),
		func(o *metav1.ListOptions) { o.LabelSelector = federation.AgentSelector })
	seen := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok {
			if id := l.toFollow(*p); id != "" {
				wg.Add(1)
				go func() { defer wg.Done(); l.follow(ctx, *p, id) }()
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, cur any) { seen(cur) },
	}); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); inf.RunWithContext(ctx) }()
	return l
}

// toFollow is the ID of p's running agent container if it is not
// streamed yet, or "".
func (l *agentLog) toFollow(p corev1.Pod) string {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name != "agent" || s.State.Running == nil || s.ContainerID == "" {
			continue
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.followed[s.ContainerID] {
			return ""
		}
		l.followed[s.ContainerID] = true
		return s.ContainerID
	}
	return ""
}

// follow streams the log of p's agent container until it ends or ctx
// does. A container that restarted before the stream opened loses
// nothing of the new one's: that is followed under its own ID.
func (l *agentLog) follow(ctx context.Context, p corev1.Pod, id string) {
	rc, err := l.c.CP.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "agent", Follow: true}).Stream(ctx)
	if err != nil {
		l.add(agentLine{pod: p.Name, node: p.Spec.NodeName, logLine: logLine{Time: time.Now(), Text: fmt.Sprintf("(log of container %s not streamed: %v)", id, err)}})
		return
	}
	defer rc.Close()
	sc := bufio.NewScanner(rc)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		l.add(agentLine{pod: p.Name, node: p.Spec.NodeName, logLine: parseLogLine(sc.Text())})
	}
}

func (l *agentLog) add(line agentLine) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
}

// print logs every line kept that was written at from or later (a line
// without a time is printed too), with its pod and node.
func (l *agentLog) print(t testing.TB, from time.Time) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if !line.Time.IsZero() && line.Time.Before(from) {
			continue
		}
		n++
		t.Logf("%s: agent %s on %s: %s", l.c.Name, line.pod, line.node, line.Text)
	}
	t.Logf("%s: %d agent lines since %s", l.c.Name, n, from.Format(time.StampMilli))
}

// sockets logs what the agent's UDP and TCP sockets hold unread on each
// live gateway candidate of c (ss): a queue that only grows says the
// agent's process is not getting to them.
func sockets(t testing.TB, c *federation.NodeCluster) {
	t.Helper()
	for _, n := range c.Candidates {
		if n.Killed() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err := n.Exec(ctx, "ss", "-uatnp")
		cancel()
		if err != nil {
			t.Logf("%s: ss on %s: %v", c.Name, n.NodeName, err)
			continue
		}
		for line := range strings.SplitSeq(string(out), "\n") {
			if strings.Contains(line, "flotilla") {
				t.Logf("%s: socket on %s: %s", c.Name, n.NodeName, strings.Join(strings.Fields(line), " "))
			}
		}
	}
}
