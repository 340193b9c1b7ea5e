package ociimage

import (
	"archive/tar"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// RefNameAnnotation names an image in an OCI layout's index.json: what
// `skopeo copy oci-archive:FILE:NAME` and `ctr images import` go by.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// BuildIndex returns a multi-platform image index of one image per spec,
// each for its Spec.Platform, in OCI media types. Two specs of one
// platform are refused: a runtime would pick either.
func BuildIndex(specs []Spec) (v1.ImageIndex, error) {
	if len(specs) == 0 {
		return nil, fmt.Errorf("image index: no image to list")
	}
	idx := mutate.IndexMediaType(empty.Index, ociTypes.index)
	seen := map[string]bool{}
	for _, s := range specs {
		p, err := platformOf(s.Platform)
		if err != nil {
			return nil, err
		}
		if seen[p.String()] {
			return nil, fmt.Errorf("image index: two images for %s", p)
		}
		seen[p.String()] = true
		img, err := build(s, ociTypes)
		if err != nil {
			return nil, fmt.Errorf("image for %s: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{MediaType: ociTypes.manifest, Platform: &p},
		})
	}
	return idx, nil
}

// WriteLayout writes idx as an OCI image layout (oci-layout, index.json,
// blobs/sha256/...) in a tar archive, named ref in index.json. The
// archive's entries are in name order and stamped with Epoch, so the same
// index gives the same bytes. The file is replaced atomically.
func WriteLayout(file, ref string, idx v1.ImageIndex) error {
	dir, err := os.MkdirTemp(filepath.Dir(file), ".layout-")
	if err != nil {
		return fmt.Errorf("write image layout %s: %w", file, err)
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write image layout %s: %w", file, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{RefNameAnnotation: ref})); err != nil {
		return fmt.Errorf("write image layout %s: %w", file, err)
	}
	tmp := file + ".tmp"
	if err := tarDir(dir, tmp); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write image layout %s: %w", file, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write image layout %s: %w", file, err)
	}
	return nil
}

// tarDir writes the directories and regular files under root to file, in
// name order, owned by root and stamped with Epoch.
func tarDir(root, file string) error {
	var paths []string
	if err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root {
			paths = append(paths, p)
		}
		return nil
	}); err != nil {
		return err
	}
	sort.Strings(paths)
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	writeErr := func() error {
		for _, p := range paths {
			info, err := os.Lstat(p)
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: Epoch, Format: tar.FormatPAX}
			switch {
			case info.IsDir():
				h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
				if err := tw.WriteHeader(h); err != nil {
					return err
				}
			case info.Mode().IsRegular():
				h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, info.Size()
				if err := tw.WriteHeader(h); err != nil {
					return err
				}
				if err := copyFile(tw, p); err != nil {
					return err
				}
			default:
				return fmt.Errorf("%s: not a file or directory", p)
			}
		}
		return tw.Close()
	}()
	if err := f.Close(); writeErr == nil {
		writeErr = err
	}
	return writeErr
}
