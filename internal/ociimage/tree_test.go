package ociimage_test

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/flotilla-io/flotilla/internal/ociimage"
)

// A tree image written under two tags reads back under each with the
// tree's files, modes and symbolic links, and no entrypoint.
func TestTreeImageReadsBackUnderEveryTag(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, filepath.Join(root, "bin", "tool"), "#!/bin/sh\n", 0o755)
	mustWrite(t, filepath.Join(root, "etc", "conf"), "x=1\n", 0o644)
	if err := os.Symlink("tool", filepath.Join(root, "bin", "sh")); err != nil {
		t.Fatal(err)
	}
	img, err := ociimage.BuildTree(ociimage.TreeSpec{Root: root, Layer: filepath.Join(t.TempDir(), "layer.tar"), Cmd: []string{"/bin/sh"}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "image.tar")
	tags := []string{"alpine/socat:1.7.4.4", "nicolaka/netshoot:v0.15"}
	if err := ociimage.WriteTags(file, tags, img); err != nil {
		t.Fatal(err)
	}
	for _, tag := range tags {
		back, err := ociimage.Read(file, tag)
		if err != nil {
			t.Fatalf("tag %s: %v", tag, err)
		}
		cf, err := back.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if len(cf.Config.Entrypoint) != 0 || len(cf.Config.Cmd) != 1 {
			t.Errorf("%s: entrypoint %q cmd %q, want none and /bin/sh", tag, cf.Config.Entrypoint, cf.Config.Cmd)
		}
		got := map[string]*tar.Header{}
		rc := mutate.Extract(back)
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got[strings.TrimSuffix(h.Name, "/")] = h
		}
		rc.Close()
		if h := got["bin/tool"]; h == nil || h.Mode != 0o755 || h.Size != 10 || h.Uid != 0 || !h.ModTime.Equal(ociimage.Epoch) {
			t.Errorf("%s: bin/tool is %+v, want 10 bytes, mode 0755, root's, at the epoch", tag, h)
		}
		if h := got["bin/sh"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "tool" {
			t.Errorf("%s: bin/sh is %+v, want a symbolic link to tool", tag, h)
		}
		if h := got["etc"]; h == nil || h.Typeflag != tar.TypeDir {
			t.Errorf("%s: etc is %+v, want a directory", tag, h)
		}
	}
}

// A tree holding a named pipe is refused, with the pipe's path, and
// leaves no layer behind.
func TestTreeImageRefusesSpecialFiles(t *testing.T) {
	root := t.TempDir()
	fifo := filepath.Join(root, "pipe")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(t.TempDir(), "layer.tar")
	_, err := ociimage.BuildTree(ociimage.TreeSpec{Root: root, Layer: layer})
	if err == nil {
		t.Fatal("a tree with a named pipe was accepted")
	}
	if want := fifo; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %s", err, want)
	}
	if _, err := os.Stat(layer); !os.IsNotExist(err) {
		t.Errorf("layer left behind: %v", err)
	}
}

func mustWrite(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}
