package main

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

// A released image runs on a real node by the digest its manifests pin,
// imported from the release's archive without a registry as docs/release.md
// says (ctr images import, then ctr images tag to the pinned name).
func TestReleasedImageRunsByDigest(t *testing.T) {
	harness.Require(t, harness.NeedsNodes...)
	dir := filepath.Join(t.TempDir(), "release")
	if err := run([]string{"-version", "v1.2.3-rc.1", "-o", dir, "-src", moduleRoot(t), "-allow-dirty",
		"-package", "./internal/version/testdata/printversion", "-image", "registry.example/flotilla",
		"-cli-platforms", "linux/amd64,linux/arm64", "-license", testLicense(t)}, &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	pinned := pinnedImage(t, filepath.Join(dir, manifestsFile))

	env := harness.New(t)
	cp := env.ControlPlane("release", harness.ControlPlaneOptions{PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Scheduler: true})
	node := cp.StartNode("n1", harness.NodeOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"images", "import", "--all-platforms", "--base-name", "registry.example/flotilla", filepath.Join(dir, imageFile)},
		// The CRI finds an imported image by a name it has, not by the
		// digest of a tag's target: name it by the digest too.
		{"images", "tag", "registry.example/flotilla:v1.2.3-rc.1", pinned},
	} {
		out, err := node.Ctr(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("ctr %s: %s", strings.Join(args, " "), strings.TrimSpace(out))
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "released", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "flotilla", Image: pinned, ImagePullPolicy: corev1.PullNever}},
		},
	}
	if _, err := cp.Client.CoreV1().Pods("default").Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 2*time.Minute, "pod released ran "+pinned+" to completion", func() error {
		p, err := cp.Client.CoreV1().Pods("default").Get(t.Context(), "released", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodSucceeded {
			return errPhase{p}
		}
		return nil
	})
}

type errPhase struct{ p *corev1.Pod }

func (e errPhase) Error() string {
	var waiting []string
	for _, s := range e.p.Status.ContainerStatuses {
		if s.State.Waiting != nil {
			waiting = append(waiting, s.State.Waiting.Reason+": "+s.State.Waiting.Message)
		}
	}
	return "phase " + string(e.p.Status.Phase) + " " + strings.Join(waiting, "; ")
}

// pinnedImage is the one image the released manifests run.
func pinnedImage(t *testing.T, file string) string {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`image: (\S+@sha256:[0-9a-f]{64})`).FindSubmatch(raw)
	if m == nil {
		t.Fatalf("%s pins no image by digest", file)
	}
	return string(m[1])
}
