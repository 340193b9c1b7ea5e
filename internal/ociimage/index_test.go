package ociimage_test

import (
	"archive/tar"
	"bytes"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/internal/ociimage"
)

// fakeBinaries writes one small file per platform, each with different
// bytes, standing in for the binaries of those platforms.
func fakeBinaries(t *testing.T, platforms ...string) []ociimage.Spec {
	t.Helper()
	var specs []ociimage.Spec
	for _, p := range platforms {
		file := filepath.Join(t.TempDir(), strings.ReplaceAll(p, "/", "-"))
		if err := os.WriteFile(file, []byte("binary for "+p), 0o755); err != nil {
			t.Fatal(err)
		}
		specs = append(specs, ociimage.Spec{Binary: file, Path: "/flotilla", Dirs: []string{"/tmp"}, Platform: p})
	}
	return specs
}

// A multi-platform image written as an OCI layout archive lists every
// platform under its name, each image holding that platform's binary;
// every blob matches its digest, and the same inputs give the same bytes.
func TestIndexListsEveryPlatform(t *testing.T) {
	specs := fakeBinaries(t, "linux/amd64", "linux/arm64")
	idx, err := ociimage.BuildIndex(specs)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "image.oci.tar")
	if err := ociimage.WriteLayout(file, "v1.2.3", idx); err != nil {
		t.Fatal(err)
	}
	l, err := ociimage.VerifyLayout(file)
	if err != nil {
		t.Fatal(err)
	}
	want, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if l.Ref != "v1.2.3" || l.Index != want {
		t.Errorf("layout names %q at %s, want v1.2.3 at %s", l.Ref, l.Index, want)
	}
	if got := slices.Sorted(maps.Keys(l.Images)); !slices.Equal(got, []string{"linux/amd64", "linux/arm64"}) {
		t.Fatalf("index lists %v, want linux/amd64 and linux/arm64", got)
	}
	for p, digest := range l.Images {
		img, err := idx.Image(digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		files, err := ociimage.Files(img)
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS+"/"+cf.Architecture != p || files["/flotilla"].Size != int64(len("binary for "+p)) {
			t.Errorf("image listed for %s is for %s/%s with /flotilla of %d bytes", p, cf.OS, cf.Architecture, files["/flotilla"].Size)
		}
	}

	again, err := ociimage.BuildIndex(fakeBinaries(t, "linux/amd64", "linux/arm64"))
	if err != nil {
		t.Fatal(err)
	}
	second := filepath.Join(dir, "again.oci.tar")
	if err := ociimage.WriteLayout(second, "v1.2.3", again); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(file)
	b, _ := os.ReadFile(second)
	if !bytes.Equal(a, b) {
		t.Error("the same binaries gave two different archives")
	}
}

// A blob changed after the archive was written is found, named by its
// digest.
func TestVerifyLayoutFindsAChangedBlob(t *testing.T) {
	idx, err := ociimage.BuildIndex(fakeBinaries(t, "linux/amd64", "linux/arm64"))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "image.oci.tar")
	if err := ociimage.WriteLayout(file, "v1", idx); err != nil {
		t.Fatal(err)
	}
	if _, err := ociimage.VerifyLayout(file); err != nil {
		t.Fatalf("the archive as written: %v", err)
	}
	// The largest blob is a layer; flip its last byte.
	changed := rewriteTar(t, file, func(files map[string][]byte) string {
		var largest string
		for name, data := range files {
			if strings.HasPrefix(name, "blobs/") && len(data) > len(files[largest]) {
				largest = name
			}
		}
		files[largest][len(files[largest])-1] ^= 0xff
		return largest
	})
	_, err = ociimage.VerifyLayout(file)
	if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(changed, "blobs/sha256/")) {
		t.Errorf("changed %s: VerifyLayout said %v, want an error naming it", changed, err)
	}
}

func TestBuildIndexRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		specs []ociimage.Spec
		want  string
	}{
		{"no image", nil, "no image"},
		{"a platform twice", fakeBinaries(t, "linux/arm64", "linux/arm64"), "two images for linux/arm64"},
		{"no architecture", fakeBinaries(t, "linux"), `platform "linux"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ociimage.BuildIndex(tc.specs); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("BuildIndex: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// rewriteTar rewrites the tar archive file after change edited its
// regular files' contents, and returns what change returned.
func rewriteTar(t *testing.T, file string, change func(map[string][]byte) string) string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	var headers []*tar.Header
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		headers, files[h.Name] = append(headers, h), data
	}
	f.Close()
	out := change(files)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range headers {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(files[h.Name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}
