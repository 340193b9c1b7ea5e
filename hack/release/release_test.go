package main

import (
	"bufio"
	"bytes"
	"debug/elf"
	"debug/macho"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"maps"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/internal/ociimage"
	"github.com/flotilla-io/flotilla/internal/version"
)

// moduleRoot is the checkout this test runs in.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// testLicense is a license file for a release of the small program: the
// module has none of its own to give its plugin archives.
func testLicense(t *testing.T) string {
	t.Helper()
	license := filepath.Join(t.TempDir(), "LICENSE")
	if err := os.WriteFile(license, []byte("The license of a release of a small program.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return license
}

// A release of a small program stands in for the whole binary's, which
// takes minutes per platform (`make release-test` cuts the real one):
// the same steps, the same checks.
func TestReleaseOfASmallProgram(t *testing.T) {
	root := moduleRoot(t)
	dir := filepath.Join(t.TempDir(), "v1.2.3-rc.1")
	license := testLicense(t)
	args := []string{"-version", "v1.2.3-rc.1", "-o", dir, "-src", root, "-allow-dirty",
		"-package", "./internal/version/testdata/printversion", "-image", "registry.example/flotilla", "-license", license}
	var out strings.Builder
	if err := run(args, &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("release: %s", out.String())
	checkSizes(t, dir, out.String())
	checkRelease(t, dir, "v1.2.3-rc.1", "registry.example/flotilla", license, func(t *testing.T, bin string) version.Info {
		out, err := exec.Command(bin).Output()
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		var got version.Info
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s printed %q: %v", bin, out, err)
		}
		return got
	})

	checkPushKeepsTheDigest(t, dir)
	t.Run("helm reads the chart", func(t *testing.T) {
		layout, err := ociimage.VerifyLayout(filepath.Join(dir, imageFile))
		if err != nil {
			t.Fatal(err)
		}
		checkChartWithHelm(t, filepath.Join(dir, chartFile("v1.2.3-rc.1")), "registry.example/flotilla@"+layout.Index.String())
	})

	// The same commit cuts the same bytes.
	again := filepath.Join(t.TempDir(), "again")
	args[3] = again
	if err := run(args, &out); err != nil {
		t.Fatal(err)
	}
	first, _ := os.ReadFile(filepath.Join(dir, sumsFile))
	second, _ := os.ReadFile(filepath.Join(again, sumsFile))
	if !bytes.Equal(first, second) {
		t.Errorf("two releases of one commit differ:\n%s\n%s", first, second)
	}
}

// checkSizes checks that a release says what a user downloads: each CLI
// binary's size, and each platform's image smaller than its binary, as a
// compressed image of it is.
func checkSizes(t *testing.T, dir, out string) {
	t.Helper()
	said := map[string]float64{}
	for _, m := range regexp.MustCompile(`(?m)^(image \S+|flotilla-\S+): ([0-9.]+) MB`).FindAllStringSubmatch(out, -1) {
		said[m[1]], _ = strconv.ParseFloat(m[2], 64)
	}
	for _, p := range binaryPlatforms {
		info, err := os.Stat(filepath.Join(dir, binaryName(p)))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := said[binaryName(p)], mb(info.Size()); fmt.Sprintf("%.1f MB", got) != want {
			t.Errorf("the release says %s is %.1f MB, want %s", binaryName(p), got, want)
		}
	}
	for _, p := range imagePlatforms {
		if got := said["image "+p]; got <= 0 || got >= said[binaryName(p)] {
			t.Errorf("the release says the %s image is %.1f MB, want more than 0 and less than its binary's %.1f MB", p, got, said[binaryName(p)])
		}
	}
}

// checkRelease checks a release directory: every file in SHA256SUMS with
// its checksum; each binary built for its platform and stamped (stamp
// reads the stamp of the binary this machine runs); the image index with
// both platforms, every blob matching its digest, each image holding its
// platform's binary; the manifests naming only the image built, by digest.
func checkRelease(t *testing.T, dir, wantVersion, image, license string, stamp func(*testing.T, string) version.Info) {
	t.Helper()
	sums := readSums(t, dir)
	want := []string{imageFile, manifestsFile, chartFile(wantVersion), krewFile}
	for _, p := range binaryPlatforms {
		want = append(want, binaryName(p), pluginArchive(p))
	}
	if got := slices.Sorted(maps.Keys(sums)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("SHA256SUMS lists %v, want %v", got, want)
	}
	for name, sum := range sums {
		if got, err := sha256File(filepath.Join(dir, name)); err != nil || got != sum {
			t.Errorf("%s: checksum %s (%v), SHA256SUMS says %s", name, got, err, sum)
		}
	}

	for _, tc := range []struct {
		platform string
		check    func(string) (string, error)
		want     string
	}{
		{"linux/amd64", elfMachine, elf.EM_X86_64.String()},
		{"linux/arm64", elfMachine, elf.EM_AARCH64.String()},
		{"darwin/amd64", machoCPU, macho.CpuAmd64.String()},
		{"darwin/arm64", machoCPU, macho.CpuArm64.String()},
	} {
		if got, err := tc.check(filepath.Join(dir, binaryName(tc.platform))); err != nil || got != tc.want {
			t.Errorf("%s: %s (%v), want %s", binaryName(tc.platform), got, err, tc.want)
		}
	}
	here := runtime.GOOS + "/" + runtime.GOARCH
	if !slices.Contains(binaryPlatforms, here) {
		t.Fatalf("this machine (%s) runs none of the released binaries", here)
	}
	commit := gitOutput(t, "rev-parse", "HEAD")
	if got := stamp(t, filepath.Join(dir, binaryName(here))); got.Version != wantVersion || strings.TrimSuffix(got.Commit, "-dirty") != commit || got.Date == "" {
		t.Errorf("%s says it is %+v, want %s of commit %s with its date", binaryName(here), got, wantVersion, commit)
	}

	layout, err := ociimage.VerifyLayout(filepath.Join(dir, imageFile))
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(layout.Images)); layout.Ref != wantVersion || !slices.Equal(got, imagePlatforms) {
		t.Errorf("image index %q lists %v, want %s listing %v", layout.Ref, got, wantVersion, imagePlatforms)
	}
	checkImagesHoldBinaries(t, dir, layout)

	pinned := image + "@" + layout.Index.String()
	checkManifests(t, filepath.Join(dir, manifestsFile), pinned)
	checkChart(t, filepath.Join(dir, chartFile(wantVersion)), wantVersion, pinned)
	checkPlugin(t, dir, wantVersion, license)
}

// checkImagesHoldBinaries checks that each platform's image holds that
// platform's released binary as /flotilla.
func checkImagesHoldBinaries(t *testing.T, dir string, l ociimage.Layout) {
	t.Helper()
	idx, err := ociimage.ReadLayout(filepath.Join(dir, imageFile), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for p, digest := range l.Images {
		img, err := idx.Image(digest)
		if err != nil {
			t.Fatal(err)
		}
		files, err := ociimage.Files(img)
		if err != nil {
			t.Fatal(err)
		}
		info, err := os.Stat(filepath.Join(dir, binaryName(p)))
		if err != nil {
			t.Fatal(err)
		}
		if f := files["/flotilla"]; f.Size != info.Size() || f.Mode != 0o755 {
			t.Errorf("the %s image's /flotilla: %d bytes, mode %v; want the %d bytes of %s, 0755", p, f.Size, f.Mode, info.Size(), binaryName(p))
		}
	}
}

// checkManifests checks that the released manifests are deploy/'s
// objects, every container running pinned and nothing else.
func checkManifests(t *testing.T, file, pinned string) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(":latest")) {
		t.Errorf("%s names a :latest image", file)
	}
	var images []string
	objects := map[string]bool{}
	for doc := range strings.SplitSeq(string(raw), "\n---\n") {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name, Namespace string
			} `json:"metadata"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers, InitContainers []struct{ Image string }
					}
				}
			}
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		objects[obj.Kind+" "+obj.Metadata.Namespace+"/"+obj.Metadata.Name] = true
		for _, c := range append(obj.Spec.Template.Spec.Containers, obj.Spec.Template.Spec.InitContainers...) {
			images = append(images, c.Image)
		}
	}
	if len(images) == 0 || slices.ContainsFunc(images, func(i string) bool { return i != pinned }) {
		t.Errorf("%s runs %v, want only %s", file, images, pinned)
	}
	for _, o := range []string{"Deployment flotilla-system/flotilla-agent", "CustomResourceDefinition /peers.flotilla.io", "Namespace /flotilla-system"} {
		if !objects[o] {
			t.Errorf("%s lacks %s", file, o)
		}
	}
}

// A release is refused, before anything is built or written, for a
// version that is not semantic, for uncommitted changes, for a platform
// it does not build and for a license file that is not there (krew
// requires one in each plugin archive).
func TestReleaseRefuses(t *testing.T) {
	dirty := t.TempDir()
	for _, args := range [][]string{{"init", "-q"}, {"-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q", "--allow-empty", "-m", "first"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dirty
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(dirty, "uncommitted.go"), []byte("package x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	emptyLicense := filepath.Join(t.TempDir(), "LICENSE")
	if err := os.WriteFile(emptyLicense, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		version, src, want string
		args               []string
	}{
		{"1.2.3", moduleRoot(t), "not a semantic version", nil},
		{"v1.2", moduleRoot(t), "not a semantic version", nil},
		{"v1.2.3.4", moduleRoot(t), "not a semantic version", nil},
		{"v01.2.3", moduleRoot(t), "not a semantic version", nil},
		{"v1.2.3+build.5", moduleRoot(t), "not a semantic version", nil},
		{"latest", moduleRoot(t), "not a semantic version", nil},
		{"v1.2.3", dirty, "uncommitted changes", nil},
		{"v1.2.3", moduleRoot(t), `"windows/amd64" is none of`, []string{"-cli-platforms", "linux/amd64,windows/amd64"}},
		{"v1.2.3", moduleRoot(t), "krew accepts no plugin whose archives lack a license file", []string{"-allow-dirty", "-license", "no-such-LICENSE"}},
		{"v1.2.3", moduleRoot(t), "not a non-empty regular file", []string{"-allow-dirty", "-license", emptyLicense}},
	} {
		t.Run(tc.version+" of "+filepath.Base(tc.src), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "release")
			err := run(append([]string{"-version", tc.version, "-o", out, "-src", tc.src}, tc.args...), &strings.Builder{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("release %s: %v, want an error saying %q", tc.version, err, tc.want)
			}
			if _, statErr := os.Stat(out); !os.IsNotExist(statErr) {
				t.Errorf("a refused release wrote %s", out)
			}
		})
	}
}

func elfMachine(file string) (string, error) {
	f, err := elf.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return f.Machine.String(), nil
}

func machoCPU(file string) (string, error) {
	f, err := macho.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return f.Cpu.String(), nil
}

// readSums reads dir's SHA256SUMS as sha256sum writes it.
func readSums(t *testing.T, dir string) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, sumsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sums := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		sum, name, ok := strings.Cut(s.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS line %q is not sha256sum's", s.Text())
		}
		sums[name] = sum
	}
	return sums
}

func gitOutput(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = moduleRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

// checkPushKeepsTheDigest pushes the released index to a registry as
// `crane push` does and reads back the digest the manifests pin.
func checkPushKeepsTheDigest(t *testing.T, dir string) {
	t.Helper()
	l, err := ociimage.VerifyLayout(filepath.Join(dir, imageFile))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := ociimage.ReadLayout(filepath.Join(dir, imageFile), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref, err := name.NewTag(strings.TrimPrefix(reg.URL, "http://") + "/flotilla:v1.2.3-rc.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	desc, err := remote.Head(ref)
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != l.Index {
		t.Errorf("pushed, %s has digest %s; the release pins %s", ref, desc.Digest, l.Index)
	}
}
