// Command release cuts a release into one directory (`make release
// VERSION=vX.Y.Z`, docs/release.md):
//
//   - flotilla-OS-ARCH: the CLI for linux and darwin on amd64 and arm64,
//     static (CGO off), built with -trimpath and stamped with the version,
//     the commit and the commit's date, so the same commit builds the same
//     bytes;
//   - flotilla-image.oci.tar: the agent's image for linux/amd64 and
//     linux/arm64 under one image index, as an OCI image layout archive
//     (internal/ociimage), named VERSION;
//   - flotilla.yaml: deploy/ rendered with kustomize, the image pinned by
//     the index's digest (IMAGE@sha256:...);
//   - flotilla-X.Y.Z.tgz: the Helm chart charts/flotilla packaged, its
//     version the release's and its image pinned by the same digest;
//   - kubectl-flotilla-OS-ARCH.tar.gz and flotilla.krew.yaml: the CLI as
//     the kubectl plugin, per platform, with the license (-license, the
//     module's LICENSE), and krew's manifest naming each archive with its
//     SHA-256;
//   - SHA256SUMS of all of them, as sha256sum -c reads it.
//
// It refuses a VERSION that is not a semantic version, a missing license
// file and a work tree with uncommitted changes, unless -allow-dirty (then the commit reads
// SHA-dirty).
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/flotilla-io/flotilla/internal/ociimage"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// The platforms of the CLI and of the image.
var (
	binaryPlatforms = []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64"}
	imagePlatforms  = []string{"linux/amd64", "linux/arm64"}
)

// Names of what a release directory holds.
const (
	imageFile     = "flotilla-image.oci.tar"
	manifestsFile = "flotilla.yaml"
	sumsFile      = "SHA256SUMS"
	versionPkg    = "github.com/flotilla-io/flotilla/internal/version"
)

type options struct {
	version, out, src, pkg, image, deploy string
	chart, downloadURL, license           string
	allowDirty                            bool
	// platforms are the CLI's: binaryPlatforms and the image's.
	platforms []string
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.version, "version", "", "the release's semantic version, e.g. v0.3.0 or v0.3.0-rc.1")
	fs.StringVar(&o.out, "o", "", "directory to write the release to (must not exist, or be empty)")
	fs.StringVar(&o.src, "src", ".", "the checkout to release (the module's root)")
	fs.StringVar(&o.pkg, "package", "./cmd/flotilla", "the program to release, relative to -src")
	fs.StringVar(&o.image, "image", deployImage, "the image's repository, as the manifests name it (where you will push the image)")
	fs.StringVar(&o.deploy, "deploy", "deploy", "the kustomization to render, relative to -src")
	fs.StringVar(&o.chart, "chart", "charts/"+chartName, "the Helm chart to package, relative to -src")
	fs.StringVar(&o.downloadURL, "download-url", downloadURL, "where the release's files will be published (VERSION is replaced by the version): the krew manifest's archives are named under it")
	fs.StringVar(&o.license, "license", pluginLicense, "the license file each kubectl plugin archive holds, relative to -src")
	fs.BoolVar(&o.allowDirty, "allow-dirty", false, "release a work tree with uncommitted changes (its commit reads SHA-dirty)")
	cli := fs.String("cli-platforms", strings.Join(binaryPlatforms, ","), "the CLI's platforms (os/arch, comma-separated); the image's are always built")
	err := fs.Parse(args)
	if err != nil {
		return err
	}
	if o.version == "" || o.out == "" {
		return errors.New("-version and -o are required")
	}
	if o.platforms, err = cliPlatforms(*cli); err != nil {
		return err
	}
	if !semver.MatchString(o.version) {
		return fmt.Errorf("VERSION %q is not a semantic version: want vMAJOR.MINOR.PATCH with an optional -PRERELEASE, such as v0.3.0 or v0.3.0-rc.1", o.version)
	}
	src, err := sourceOf(o.src)
	if err != nil {
		return err
	}
	if src.dirty {
		if !o.allowDirty {
			return fmt.Errorf("%s has uncommitted changes (git status): commit or stash them, or set ALLOW_DIRTY=1 for a build whose commit reads %s-dirty", o.src, src.commit)
		}
		src.commit += "-dirty"
	}
	if !filepath.IsAbs(o.license) {
		o.license = filepath.Join(o.src, o.license)
	}
	if err := checkLicense(o.license); err != nil {
		return err
	}
	if err := emptyDir(o.out); err != nil {
		return err
	}
	ldflags := fmt.Sprintf("-s -w -X %[1]s.Version=%[2]s -X %[1]s.Commit=%[3]s -X %[1]s.Date=%[4]s", versionPkg, o.version, src.commit, src.date)
	binaries := map[string]string{}
	for _, p := range o.platforms {
		file, err := buildBinary(o, p, ldflags)
		if err != nil {
			return err
		}
		binaries[p] = file
	}
	if err := writePlugin(o, binaries); err != nil {
		return err
	}
	digest, imageSizes, err := writeImage(o, binaries)
	if err != nil {
		return err
	}
	ref := o.image + "@" + digest
	if err := writeManifests(o, ref); err != nil {
		return err
	}
	if err := writeChart(o, ref); err != nil {
		return err
	}
	if err := writeSums(o.out); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "release %s (commit %s, %s) in %s\nimage %s\n", o.version, src.commit, src.date, o.out, ref)
	return printSizes(stdout, binaries, imageSizes)
}

// printSizes says what a user downloads: each platform's image as a
// registry sends it (manifest, config and compressed layers), and each
// CLI binary.
func printSizes(w io.Writer, binaries map[string]string, images map[string]int64) error {
	for _, p := range imagePlatforms {
		fmt.Fprintf(w, "image %s: %s compressed\n", p, mb(images[p]))
	}
	for _, p := range slices.Sorted(maps.Keys(binaries)) {
		info, err := os.Stat(binaries[p])
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s: %s\n", filepath.Base(binaries[p]), mb(info.Size()))
	}
	return nil
}

// mb is n bytes in megabytes (10^6), as docs/benchmarks.md gives sizes.
func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// cliPlatforms parses -cli-platforms: each one of binaryPlatforms; the
// image's platforms are built whatever it says, since the image holds
// them.
func cliPlatforms(list string) ([]string, error) {
	out := slices.Clone(imagePlatforms)
	for p := range strings.SplitSeq(list, ",") {
		if p = strings.TrimSpace(p); p == "" || slices.Contains(out, p) {
			continue
		}
		if !slices.Contains(binaryPlatforms, p) {
			return nil, fmt.Errorf("-cli-platforms: %q is none of %s", p, strings.Join(binaryPlatforms, ", "))
		}
		out = append(out, p)
	}
	return out, nil
}

// semver is semver.org's grammar with the v Go and git tags use; build
// metadata (+...) is left out: an image tag cannot carry a plus.
var semver = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-((0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*))?$`)

// source is the commit a release is built from.
type source struct {
	commit string
	// date is the commit's date in UTC (RFC 3339), not the build's.
	date  string
	dirty bool
}

func sourceOf(dir string) (source, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return "", fmt.Errorf("git %s in %s: %v: %s", strings.Join(args, " "), dir, err, strings.TrimSpace(string(ee.Stderr)))
			}
			return "", fmt.Errorf("git %s in %s: %w", strings.Join(args, " "), dir, err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	var s source
	var err error
	if s.commit, err = git("rev-parse", "HEAD"); err != nil {
		return s, err
	}
	unix, err := git("show", "-s", "--format=%ct", "HEAD")
	if err != nil {
		return s, err
	}
	secs, err := strconv.ParseInt(unix, 10, 64)
	if err != nil {
		return s, fmt.Errorf("the date of commit %s: %q: %w", s.commit, unix, err)
	}
	s.date = time.Unix(secs, 0).UTC().Format(time.RFC3339)
	status, err := git("status", "--porcelain")
	if err != nil {
		return s, err
	}
	s.dirty = status != ""
	return s, nil
}

// emptyDir makes dir, or accepts it empty: a release never mixes with
// what another left.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return fmt.Errorf("release directory: %w", err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("release directory %s is not empty: remove it or name another", dir)
	}
	return nil
}

// binaryName is the file of platform's CLI, e.g. flotilla-linux-arm64.
func binaryName(platform string) string {
	return "flotilla-" + strings.ReplaceAll(platform, "/", "-")
}

// buildBinary builds the program for platform, static and reproducible.
func buildBinary(o options, platform, ldflags string) (string, error) {
	goos, goarch, _ := strings.Cut(platform, "/")
	file, err := filepath.Abs(filepath.Join(o.out, binaryName(platform)))
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", file, o.pkg)
	cmd.Dir = o.src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s for %s: %v\n%s", o.pkg, platform, err, out)
	}
	return file, nil
}

// writeImage writes the image index of the linux binaries and returns its
// digest, read back from the archive as a registry would see it.
func writeImage(o options, binaries map[string]string) (string, map[string]int64, error) {
	var specs []ociimage.Spec
	for _, p := range imagePlatforms {
		specs = append(specs, ociimage.Spec{Binary: binaries[p], Path: "/flotilla", Dirs: []string{"/tmp"}, Platform: p})
	}
	idx, err := ociimage.BuildIndex(specs)
	if err != nil {
		return "", nil, err
	}
	file := filepath.Join(o.out, imageFile)
	if err := ociimage.WriteLayout(file, o.version, idx); err != nil {
		return "", nil, err
	}
	l, err := ociimage.VerifyLayout(file)
	if err != nil {
		return "", nil, err
	}
	sizes, err := imageSizes(idx)
	if err != nil {
		return "", nil, err
	}
	return l.Index.String(), sizes, nil
}

// imageSizes are the bytes a registry sends of each platform's image of
// idx: its manifest, config and (compressed) layers.
func imageSizes(idx v1.ImageIndex) (map[string]int64, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image index: %w", err)
	}
	sizes := map[string]int64{}
	for _, d := range m.Manifests {
		if d.Platform == nil {
			return nil, fmt.Errorf("image index: manifest %s names no platform", d.Digest)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", d.Digest, err)
		}
		im, err := img.Manifest()
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", d.Digest, err)
		}
		n := d.Size + im.Config.Size
		for _, l := range im.Layers {
			n += l.Size
		}
		sizes[d.Platform.OS+"/"+d.Platform.Architecture] = n
	}
	return sizes, nil
}

// writeManifests renders the kustomization with every image of the
// repository pinned to ref, and refuses output that names any other.
func writeManifests(o options, ref string) error {
	rendered, err := render(filepath.Join(o.src, o.deploy), ref)
	if err != nil {
		return err
	}
	if err := pinnedOnly(rendered, ref); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, manifestsFile), rendered, 0o644)
}

// deployImage is the image deploy/ names (with :latest), which a release
// replaces.
const deployImage = "ghcr.io/flotilla-io/flotilla"

// render runs kustomize on an overlay of deploy that replaces deployImage
// by ref.
func render(deploy, ref string) ([]byte, error) {
	overlay, err := os.MkdirTemp("", "flotilla-release-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(overlay)
	abs, err := filepath.Abs(deploy)
	if err != nil {
		return nil, err
	}
	rel, err := filepath.Rel(overlay, abs)
	if err != nil {
		return nil, err
	}
	name, digest, _ := strings.Cut(ref, "@")
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\nimages:\n- name: %s\n  newName: %s\n  digest: %s\n", rel, deployImage, name, digest)
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return nil, err
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", deploy, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", deploy, err)
	}
	return out, nil
}

// imageLine is an image a manifest names.
var imageLine = regexp.MustCompile(`(?m)^\s*-?\s*image:\s*"?([^"\s]+)"?\s*$`)

// pinnedOnly refuses manifests that name no image, or an image but ref.
func pinnedOnly(manifests []byte, ref string) error {
	found := imageLine.FindAllSubmatch(manifests, -1)
	if len(found) == 0 {
		return errors.New("the rendered manifests name no image")
	}
	for _, m := range found {
		if string(m[1]) != ref {
			return fmt.Errorf("the rendered manifests name image %s, want only %s", m[1], ref)
		}
	}
	return nil
}

// writeSums writes SHA256SUMS of every file in dir, in name order.
func writeSums(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != sumsFile {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		sum, err := sha256File(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, n)
	}
	return os.WriteFile(filepath.Join(dir, sumsFile), []byte(b.String()), 0o644)
}

func sha256File(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("checksum of %s: %w", file, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
