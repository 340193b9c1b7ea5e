// Package ociimage builds container images without a container engine or a
// registry: one layer holding a static binary on an empty base, written as
// an image tarball in the `docker save` layout (manifest.json, the config,
// the layer), which `ctr images import`, `docker load` and
// go-containerregistry read back with the image's name and tag.
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
}

// Build returns the image Spec describes, for linux/amd64.
func Build(s Spec) (v1.Image, error) {
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
	return imageOf(layer, "ociimage: "+s.Path, entrypoint, s.Cmd, s.Env)
}

// imageOf is the linux/amd64 image of one layer, stamped with Epoch, with
// its entrypoint, command and environment.
func imageOf(layer v1.Layer, createdBy string, entrypoint, cmd, env []string) (v1.Image, error) {
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: Epoch}, CreatedBy: createdBy},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image configuration: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
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
