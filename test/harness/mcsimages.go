package harness

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/flotilla-io/flotilla/internal/ociimage"
)

// The images the MCS API conformance suite's pods run. The suite sets no
// pull policy, so with these names present in a node's containerd its
// pods run without a registry.
const (
	// SocatImage serves the suite's echo ports: sh, grep -E, awk, tr
	// and socat.
	SocatImage = "alpine/socat:1.7.4.4"
	// NetshootImage sends the suite's requests: sh, sleep, BIND's
	// nslookup and OpenBSD's nc (-4, -6).
	NetshootImage = "nicolaka/netshoot:v0.15"
)

// suitePackages are the Debian packages of both suite images (one root
// filesystem serves both): a minimal base and the tools the suite runs.
var suitePackages = []string{"dash", "coreutils", "grep", "mawk", "socat", "bind9-dnsutils", "netcat-openbsd"}

// suiteLinks are what the packages' maintainer scripts would make
// (alternatives, the shell): relative symbolic links in the root.
var suiteLinks = map[string]string{
	"bin/sh":      "dash",
	"usr/bin/awk": "mawk",
	"bin/nc":      "nc.openbsd",
}

// suiteSmoke runs in the root filesystem (chroot, without /dev) before it
// becomes an image: every tool the suite calls starts and finds its
// libraries.
const suiteSmoke = `set -e
test "$(echo 'a,b' | tr ',' ' ' | awk '{print $2}')" = b
echo 10.0.0.1 | grep -qE '^[0-9]{1,3}(\.[0-9]{1,3}){3}$'
v=$(socat -V)
v=$(nslookup -version 2>&1)
nc -h 2>&1 | grep -q -- '-4'
sleep 0
`

// DebianTools are what MCSSuiteImages builds with: apt's download of
// packages (its package lists current), dpkg-deb, ldconfig and chroot.
var DebianTools = Requirement{
	Name: "apt-get download of " + strings.Join(suitePackages, ", ") + ", dpkg-deb, ldconfig, chroot",
	Check: func() error {
		for _, b := range []string{"apt-get", "apt-cache", "dpkg-deb", "ldconfig", "chroot"} {
			if _, err := exec.LookPath(b); err != nil {
				return err
			}
		}
		_, err := suiteDebs()
		return err
	},
	Fix: "apt-get update (Debian's package lists, for apt-get download); apt-get install -y --no-install-recommends apt dpkg libc-bin coreutils",
}

var suiteImages struct {
	once sync.Once
	path string
	err  error
}

// MCSSuiteImages returns an image tarball holding one image under both
// SocatImage and NetshootImage, for NodeOptions.Images: Debian's packages
// (apt-get download, unpacked with dpkg-deb) as a root filesystem. It is
// built once into the cache, named after the packages' versions, and
// rebuilt only when they change.
func MCSSuiteImages(t TB) string {
	t.Helper()
	b := &suiteImages
	b.once.Do(func() { b.path, b.err = buildSuiteImages() })
	if b.err != nil {
		t.Fatalf("harness: the MCS conformance suite's images: %v", b.err)
	}
	return b.path
}

// suiteDebs lists the .deb files (as apt-get download names them) of
// suitePackages and everything they depend on, without downloading.
func suiteDebs() ([]string, error) {
	args := append([]string{"depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"}, suitePackages...)
	out, err := exec.Command("apt-cache", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("apt-cache depends %s: %w", strings.Join(suitePackages, " "), cmdErr(err))
	}
	var pkgs []string
	for _, line := range strings.Split(string(out), "\n") {
		// Package names start a line; virtual ones are <bracketed>.
		if line != "" && !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "<") && !slices.Contains(pkgs, line) {
			pkgs = append(pkgs, line)
		}
	}
	out, err = exec.Command("apt-get", append([]string{"download", "--print-uris"}, pkgs...)...).Output()
	if err != nil {
		return nil, fmt.Errorf("apt-get download --print-uris: %w", cmdErr(err))
	}
	var debs []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && strings.HasSuffix(f[1], ".deb") {
			debs = append(debs, f[1])
		}
	}
	if len(debs) != len(pkgs) {
		return nil, fmt.Errorf("apt-get download knows %d of the %d packages %s", len(debs), len(pkgs), strings.Join(pkgs, " "))
	}
	slices.Sort(debs)
	return debs, nil
}

func buildSuiteImages() (string, error) {
	debs, err := suiteDebs()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(CacheDir(), "mcs-images")
	debDir := filepath.Join(dir, "debs")
	if err := os.MkdirAll(debDir, 0o755); err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(strings.Join(append(debs, suiteSmoke), "\n")))
	path := filepath.Join(dir, "suite-"+hex.EncodeToString(sum[:8])+".tar")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := downloadDebs(debDir, debs); err != nil {
		return "", err
	}
	work, err := os.MkdirTemp(dir, "build")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	root := filepath.Join(work, "root")
	if err := unpackRoot(root, debDir, debs); err != nil {
		return "", err
	}
	img, err := ociimage.BuildTree(ociimage.TreeSpec{
		Root: root, Layer: filepath.Join(work, "layer.tar"), Cmd: []string{"/bin/sh"},
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	})
	if err != nil {
		return "", err
	}
	if err := ociimage.WriteTags(filepath.Join(work, "image.tar"), []string{SocatImage, NetshootImage}, img); err != nil {
		return "", err
	}
	return path, os.Rename(filepath.Join(work, "image.tar"), path)
}

// downloadDebs fetches into dir those of debs it does not hold yet.
func downloadDebs(dir string, debs []string) error {
	var missing []string
	for _, d := range debs {
		if _, err := os.Stat(filepath.Join(dir, d)); err != nil {
			name, _, _ := strings.Cut(d, "_")
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	cmd := exec.Command("apt-get", append([]string{"download"}, missing...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s: %v: %s (run apt-get update if the package lists are old)", strings.Join(missing, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// unpackRoot unpacks debs into root as dpkg would leave them less the
// maintainer scripts, whose effects the suite needs are suiteLinks and
// the loader's cache; drops the documentation; and runs suiteSmoke in it.
func unpackRoot(root, debDir string, debs []string) error {
	for _, d := range debs {
		if out, err := exec.Command("dpkg-deb", "-x", filepath.Join(debDir, d), root).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %v: %s", d, err, bytes.TrimSpace(out))
		}
	}
	for _, d := range []string{"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian"} {
		if err := os.RemoveAll(filepath.Join(root, d)); err != nil {
			return err
		}
	}
	for link, target := range suiteLinks {
		p := filepath.Join(root, link)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.Symlink(target, p); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o1777); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		return err
	}
	conf := filepath.Join(root, "etc", "ld.so.conf")
	if err := os.WriteFile(conf, []byte("include /etc/ld.so.conf.d/*.conf\n"), 0o644); err != nil {
		return err
	}
	if out, err := exec.Command("ldconfig", "-r", root).CombinedOutput(); err != nil {
		return fmt.Errorf("ldconfig -r %s: %v: %s", root, err, bytes.TrimSpace(out))
	}
	cmd := exec.Command("chroot", root, "/bin/sh", "-c", suiteSmoke)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("the tools in the image do not run (chroot %s sh -c ...): %v: %s", root, err, bytes.TrimSpace(out))
	}
	return nil
}

func cmdErr(err error) error {
	if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
		return fmt.Errorf("%v: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return err
}
