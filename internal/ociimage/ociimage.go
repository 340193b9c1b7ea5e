// Package ociimage builds container images without a container engine or a
// registry: one layer holding a static binary on an empty base, written as
// an image tarball in the `docker save` layout (manifest.json, the config,
// the layer), which `ctr images import`, `docker load` and
// go-containerregistry read back with the image's name and tag; or one
// such image per platform under a multi-platform image index, written as
// an OCI image layout in a tar archive (BuildIndex, WriteLayout).
//
// Images are reproducible: every timestamp in the layer and the
// configuration is fixed, so the same binary gives the same image digest.
package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Epoch is the time stamped on every file and on the image itself, so that
// builds are reproducible. It is the start of 2000 rather than zero, which
// some tools print as "55 years ago" and others reject.
var Epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Spec describes a one-binary image.
type Spec struct {
	// Binary is the path of a static binary on this machine.
	Binary string
	// Path is where the binary lives in the image, e.g. "/flotilla".
	Path string
	// Entrypoint defaults to []string{Path}.
	Entrypoint []string
	// Cmd are default arguments after the entrypoint.
	Cmd []string
	// Env are "KEY=value" pairs.
	Env []string
	// Dirs are empty directories to create (mode 1777 for "/tmp", else
	// 0755), for programs that write scratch files.
	Dirs []string
	// Platform is the binary's "os/arch", e.g. "linux/arm64"; empty is
	// linux/amd64.
	Platform string
}

// Build returns the image Spec describes, in the media types of `docker
// save` (Write's tarball).
func Build(s Spec) (v1.Image, error) {
	return build(s, dockerTypes)
}

func build(s Spec, mt mediaTypes) (v1.Image, error) {
	platform, err := platformOf(s.Platform)
	if err != nil {
		return nil, err
	}
	if !path.IsAbs(s.Path) || path.Clean(s.Path) != s.Path {
		return nil, fmt.Errorf("image path %q: want a clean absolute path such as /flotilla", s.Path)
	}
	bin, err := os.ReadFile(s.Binary)
	if err != nil {
		return nil, fmt.Errorf("read the image's binary: %w", err)
	}
	layerTar, err := layerOf(s, bin)
	if err != nil {
		return nil, fmt.Errorf("layer of %s: %w", s.Binary, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("layer of %s: %w", s.Binary, err)
	}
	entrypoint := s.Entrypoint
	if len(entrypoint) == 0 {
		entrypoint = []string{s.Path}
	}
	return imageOf(layer, "ociimage: "+s.Path, platform, mt, entrypoint, s.Cmd, s.Env)
}

// platformOf parses "os/arch", empty meaning linux/amd64.
func platformOf(s string) (v1.Platform, error) {
	if s == "" {
		return v1.Platform{OS: "linux", Architecture: "amd64"}, nil
	}
	p, err := v1.ParsePlatform(s)
	if err != nil || p.OS == "" || p.Architecture == "" {
		return v1.Platform{}, fmt.Errorf("platform %q: want os/arch, such as linux/arm64", s)
	}
	return *p, nil
}

// mediaTypes are the media types an image's manifest, configuration and
// layer are written with.
type mediaTypes struct{ index, manifest, config, layer types.MediaType }

var (
	// dockerTypes are what `docker save` tarballs carry.
	dockerTypes = mediaTypes{types.DockerManifestList, types.DockerManifestSchema2, types.DockerConfigJSON, types.DockerLayer}
	// ociTypes are an OCI image index's.
	ociTypes = mediaTypes{types.OCIImageIndex, types.OCIManifestSchema1, types.OCIConfigJSON, types.OCILayer}
)

// imageOf is the image of one layer for platform, stamped with Epoch,
// with its entrypoint, command and environment.
func imageOf(layer v1.Layer, createdBy string, platform v1.Platform, mt mediaTypes, entrypoint, cmd, env []string) (v1.Image, error) {
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, mt.manifest), mt.config)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: mt.layer,
		History:   v1.History{Created: v1.Time{Time: Epoch}, CreatedBy: createdBy},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image configuration: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = platform.OS, platform.Architecture, platform.Variant
	cf.Created = v1.Time{Time: Epoch}
	cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Env = entrypoint, cmd, env
	return mutate.ConfigFile(img, cf)
}

// layerOf returns the uncompressed layer: the parent directories, the extra
// directories and the binary, owned by root, stamped with Epoch.
func layerOf(s Spec, bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	dir := func(d string, mode int64) error {
		d = strings.TrimPrefix(path.Clean(d), "/")
		if d == "" || d == "." || seen[d] {
			return nil
		}
		seen[d] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: Epoch, Format: tar.FormatPAX})
	}
	parents := func(p string) error {
		var ds []string
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			ds = append([]string{d}, ds...)
		}
		for _, d := range ds {
			if err := dir(d, 0o755); err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range s.Dirs {
		if !path.IsAbs(d) {
			return nil, fmt.Errorf("directory %q: want an absolute path", d)
		}
		if err := parents(d); err != nil {
			return nil, err
		}
		mode := int64(0o755)
		if path.Clean(d) == "/tmp" {
			mode = 0o1777
		}
		if err := dir(d, mode); err != nil {
			return nil, err
		}
	}
	if err := parents(s.Path); err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: strings.TrimPrefix(s.Path, "/"), Mode: 0o755,
		Size: int64(len(bin)), ModTime: Epoch, Format: tar.FormatPAX,
	}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Write writes img to file as an image tarball tagged tag (for example
// "flotilla.local/pause:1"). The file is replaced atomically.
func Write(file, tag string, img v1.Image) error {
	ref, err := name.NewTag(tag, name.WeakValidation)
	if err != nil {
		return fmt.Errorf("image tag %q: %w", tag, err)
	}
	tmp := file + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write image %s to %s: %w", tag, file, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write image %s: %w", tag, err)
	}
	return nil
}

// Read reads the image tagged tag back from an image tarball.
func Read(file, tag string) (v1.Image, error) {
	ref, err := name.NewTag(tag, name.WeakValidation)
	if err != nil {
		return nil, fmt.Errorf("image tag %q: %w", tag, err)
	}
	img, err := tarball.ImageFromPath(file, &ref)
	if err != nil {
		return nil, fmt.Errorf("read image %s from %s: %w", tag, file, err)
	}
	return img, nil
}

// Files lists the regular files of img's layers with their modes and sizes,
// for checking what an image holds.
func Files(img v1.Image) (map[string]FileInfo, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	out := map[string]FileInfo{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read image layers: %w", err)
		}
		out["/"+strings.Trim(h.Name, "/")] = FileInfo{Dir: h.Typeflag == tar.TypeDir, Mode: os.FileMode(h.Mode).Perm(), Size: h.Size, ModTime: h.ModTime}
	}
}

// FileInfo is what Files reports of one entry.
type FileInfo struct {
	Dir     bool
	Mode    os.FileMode
	Size    int64
	ModTime time.Time
}
