package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// Layout is what an OCI layout archive holds, as VerifyLayout found it.
type Layout struct {
	// Ref is the name index.json gives the image index.
	Ref string
	// Index is the image index's digest: what a manifest pins
	// (image@sha256:...) and a registry keeps when the archive is copied
	// with its digests preserved.
	Index v1.Hash
	// Images are the index's image manifests by platform ("linux/arm64").
	Images map[string]v1.Hash
}

// VerifyLayout reads an archive WriteLayout wrote, without trusting it:
// index.json must name one image index, every blob it reaches (the index,
// each platform's manifest, configuration and layers) must be in the
// archive with the size and SHA-256 digest its descriptor says, and each
// configuration must be for the platform the index lists it under.
func VerifyLayout(file string) (Layout, error) {
	files, err := readTar(file)
	if err != nil {
		return Layout{}, fmt.Errorf("image layout %s: %w", file, err)
	}
	l, err := verifyLayout(files)
	if err != nil {
		return Layout{}, fmt.Errorf("image layout %s: %w", file, err)
	}
	return l, nil
}

func verifyLayout(files map[string][]byte) (Layout, error) {
	var marker struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(files["oci-layout"], &marker); err != nil || marker.Version != "1.0.0" {
		return Layout{}, errors.New("no oci-layout file of version 1.0.0: not an OCI image layout")
	}
	var top v1.IndexManifest
	if err := json.Unmarshal(files["index.json"], &top); err != nil {
		return Layout{}, fmt.Errorf("index.json: %w", err)
	}
	if len(top.Manifests) != 1 {
		return Layout{}, fmt.Errorf("index.json lists %d entries, want the one image index", len(top.Manifests))
	}
	d := top.Manifests[0]
	raw, err := blob(files, d)
	if err != nil {
		return Layout{}, err
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(raw, &idx); err != nil || !d.MediaType.IsIndex() {
		return Layout{}, fmt.Errorf("index.json names %s (%s), not an image index", d.Digest, d.MediaType)
	}
	l := Layout{Ref: d.Annotations[RefNameAnnotation], Index: d.Digest, Images: map[string]v1.Hash{}}
	for _, m := range idx.Manifests {
		if m.Platform == nil {
			return Layout{}, fmt.Errorf("image index lists %s without a platform", m.Digest)
		}
		p := m.Platform.String()
		if _, dup := l.Images[p]; dup {
			return Layout{}, fmt.Errorf("image index lists %s twice", p)
		}
		if err := verifyImage(files, m); err != nil {
			return Layout{}, fmt.Errorf("image for %s: %w", p, err)
		}
		l.Images[p] = m.Digest
	}
	return l, nil
}

// verifyImage checks one platform's manifest, its configuration and its
// layers.
func verifyImage(files map[string][]byte, d v1.Descriptor) error {
	raw, err := blob(files, d)
	if err != nil {
		return err
	}
	var m v1.Manifest
	if err := json.Unmarshal(raw, &m); err != nil || !d.MediaType.IsImage() {
		return fmt.Errorf("%s (%s) is not an image manifest", d.Digest, d.MediaType)
	}
	raw, err = blob(files, m.Config)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	var cf v1.ConfigFile
	if err := json.Unmarshal(raw, &cf); err != nil {
		return fmt.Errorf("configuration %s: %w", m.Config.Digest, err)
	}
	if got := cf.Platform(); got == nil || !got.Equals(*d.Platform) {
		return fmt.Errorf("configuration %s is for %s/%s", m.Config.Digest, cf.OS, cf.Architecture)
	}
	for _, layer := range m.Layers {
		if _, err := blob(files, layer); err != nil {
			return fmt.Errorf("layer: %w", err)
		}
	}
	return nil
}

// blob is the content d names, checked against its size and digest.
func blob(files map[string][]byte, d v1.Descriptor) ([]byte, error) {
	if d.Digest.Algorithm != "sha256" {
		return nil, fmt.Errorf("blob %s: only sha256 digests are written", d.Digest)
	}
	data, ok := files["blobs/sha256/"+d.Digest.Hex]
	if !ok {
		return nil, fmt.Errorf("blob %s is missing", d.Digest)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != d.Digest.Hex || int64(len(data)) != d.Size {
		return nil, fmt.Errorf("blob %s: %d bytes of digest sha256:%s, its descriptor says %d bytes", d.Digest, len(data), got, d.Size)
	}
	return data, nil
}

// readTar returns the regular files of a tar archive by name.
func readTar(file string) (map[string][]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		var b bytes.Buffer
		if _, err := io.Copy(&b, tr); err != nil {
			return nil, err
		}
		out[h.Name] = b.Bytes()
	}
}

// ReadLayout unpacks an archive WriteLayout wrote into dir (empty) and
// returns the image index it names. It checks nothing: VerifyLayout does.
func ReadLayout(file, dir string) (v1.ImageIndex, error) {
	files, err := readTar(file)
	if err != nil {
		return nil, fmt.Errorf("image layout %s: %w", file, err)
	}
	for name, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if !strings.HasPrefix(p, filepath.Clean(dir)+string(filepath.Separator)) {
			return nil, fmt.Errorf("image layout %s: entry %q leaves the directory", file, name)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return nil, err
		}
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("image layout %s: %w", file, err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image layout %s: %w", file, err)
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("image layout %s: index.json lists %d entries, want the one image index", file, len(m.Manifests))
	}
	return top.ImageIndex(m.Manifests[0].Digest)
}
