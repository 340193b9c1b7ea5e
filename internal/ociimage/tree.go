package ociimage

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TreeSpec describes an image whose one layer is a directory tree of this
// machine, such as a root filesystem unpacked from distribution packages.
type TreeSpec struct {
	// Root is the directory that becomes the image's /.
	Root string
	// Layer is where the layer's tar is written (it stays: the image
	// reads it back when written out).
	Layer string
	// Entrypoint and Cmd are the image's; both empty leaves a pod's
	// command to say what runs.
	Entrypoint, Cmd []string
	// Env are "KEY=value" pairs.
	Env []string
}

// BuildTree returns the image TreeSpec describes, for linux/amd64: every
// directory, regular file and symbolic link under Root, owned by root,
// stamped with Epoch, in name order, so the same tree gives the same
// digest.
func BuildTree(s TreeSpec) (v1.Image, error) {
	if err := writeTreeLayer(s.Root, s.Layer); err != nil {
		return nil, fmt.Errorf("layer of %s: %w", s.Root, err)
	}
	layer, err := tarball.LayerFromFile(s.Layer)
	if err != nil {
		return nil, fmt.Errorf("layer of %s: %w", s.Root, err)
	}
	return imageOf(layer, "ociimage: tree", v1.Platform{OS: "linux", Architecture: "amd64"}, dockerTypes, s.Entrypoint, s.Cmd, s.Env)
}

// writeTreeLayer writes the uncompressed layer of root to file. Device
// files, sockets and pipes have no place in an image and are refused.
func writeTreeLayer(root, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	walkErr := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(info.Mode().Perm()), ModTime: Epoch, Format: tar.FormatPAX}
		if info.Mode()&fs.ModeSetuid != 0 {
			h.Mode |= 0o4000
		}
		if info.Mode()&fs.ModeSetgid != 0 {
			h.Mode |= 0o2000
		}
		if info.Mode()&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		switch {
		case info.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
			return tw.WriteHeader(h)
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname = tar.TypeSymlink, target
			return tw.WriteHeader(h)
		case info.Mode().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, info.Size()
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			return copyFile(tw, p)
		default:
			return fmt.Errorf("%s: a %s, not a file, directory or symbolic link", p, info.Mode().Type())
		}
	})
	if err := tw.Close(); walkErr == nil {
		walkErr = err
	}
	if err := f.Close(); walkErr == nil {
		walkErr = err
	}
	if walkErr != nil {
		os.Remove(file)
	}
	return walkErr
}

func copyFile(w io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// WriteTags writes img to file as one image tarball under every tag of
// tags, which `ctr images import` imports as that many names of the same
// image. The file is replaced atomically.
func WriteTags(file string, tags []string, img v1.Image) error {
	refs := map[name.Reference]v1.Image{}
	for _, tag := range tags {
		ref, err := name.NewTag(tag, name.WeakValidation)
		if err != nil {
			return fmt.Errorf("image tag %q: %w", tag, err)
		}
		refs[ref] = img
	}
	tmp := file + ".tmp"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write image %v to %s: %w", tags, file, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write image %v: %w", tags, err)
	}
	return nil
}
