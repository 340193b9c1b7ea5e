package main

import (
	"debug/macho"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The cleanup Job's pod is what cleanup needs on that node and no more:
// the node's network, NET_ADMIN alone, no API token, no retry.
func TestCleanupJobPod(t *testing.T) {
	j := cleanupJob{node: "gw", namespace: "kube-system", image: "example.org/flotilla:v1"}
	job := j.job([]string{"--wireguard-interface=wg9"})
	p := job.Spec.Template.Spec
	c := p.Containers[0]
	switch {
	case p.NodeName != "gw" || !p.HostNetwork || p.RestartPolicy != corev1.RestartPolicyNever:
		t.Errorf("node %q, hostNetwork %v, restart %s", p.NodeName, p.HostNetwork, p.RestartPolicy)
	case p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken:
		t.Error("the pod mounts a service account token")
	case *job.Spec.BackoffLimit != 0:
		t.Errorf("backoffLimit %d", *job.Spec.BackoffLimit)
	case c.Image != "example.org/flotilla:v1" || !slices.Equal(c.Args, []string{"cleanup", "--wireguard-interface=wg9"}):
		t.Errorf("image %s, args %v", c.Image, c.Args)
	case c.SecurityContext.Privileged != nil || !slices.Equal(c.SecurityContext.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) ||
		!slices.Equal(c.SecurityContext.Capabilities.Drop, []corev1.Capability{"ALL"}):
		t.Errorf("security context %+v", c.SecurityContext)
	case job.Labels["app.kubernetes.io/managed-by"] != "flotilla" || job.GenerateName != "flotilla-cleanup-gw-":
		t.Errorf("labels %v, generateName %q", job.Labels, job.GenerateName)
	}
}

// The macOS CLI has `cleanup --node`: the Job needs no netlink on the
// machine that makes it, so the command and the Job are linked into the
// darwin binary (which links no data path; layout_test.go).
func TestDarwinCLICleansUpByJob(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "flotilla-darwin-arm64")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(cmd.Environ(), "GOOS=darwin", "GOARCH=arm64", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the darwin CLI: %v\n%s", err, out)
	}
	f, err := macho.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Symtab == nil {
		t.Fatal("the darwin CLI has no symbol table")
	}
	linked := map[string]bool{}
	for _, s := range f.Symtab.Syms {
		linked[s.Name] = true
	}
	for _, fn := range []string{"main.newCleanupCommand", "main.cleanupJob.run", "main.cleanupFlags"} {
		if !linked[fn] {
			t.Errorf("the darwin CLI lacks %s", fn)
		}
	}
}

// The Job's cleanup gets only the names given on the command line; the
// node's cleanup fills in the agent's defaults for the others.
func TestCleanupJobTakesGivenNames(t *testing.T) {
	cmd := newCleanupCommand()
	if err := cmd.ParseFlags([]string{"--node", "gw", "--nft-table", "ours", "--route-table", "7"}); err != nil {
		t.Fatal(err)
	}
	if got, want := cleanupFlags(cmd), []string{"--route-table=7", "--nft-table=ours"}; !slices.Equal(got, want) {
		t.Errorf("the Job's cleanup gets %q, want %q", got, want)
	}
}
