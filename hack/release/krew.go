package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// The kubectl plugin: krew installs an archive per platform holding the
// CLI as kubectl-flotilla, which kubectl runs as `kubectl flotilla`.
const (
	pluginBinary = "kubectl-flotilla"
	krewFile     = "flotilla.krew.yaml"
	// downloadURL is where a release's files are published, VERSION
	// replaced by the release's.
	downloadURL = "https://github.com/flotilla-io/flotilla/releases/download/VERSION"
)

// pluginArchive is platform's plugin archive, e.g.
// kubectl-flotilla-linux-arm64.tar.gz.
func pluginArchive(platform string) string {
	return pluginBinary + "-" + strings.ReplaceAll(platform, "/", "-") + ".tar.gz"
}

// krewPlugin is krew's plugin manifest (krew.googlecontainertools.github.com/v1alpha2).
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string         `json:"version"`
		Homepage         string         `json:"homepage"`
		ShortDescription string         `json:"shortDescription"`
		Description      string         `json:"description"`
		Platforms        []krewPlatform `json:"platforms"`
	} `json:"spec"`
}

type krewPlatform struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	URI    string `json:"uri"`
	SHA256 string `json:"sha256"`
	Bin    string `json:"bin"`
	Files  []struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"files"`
}

// writePlugin writes each CLI platform's plugin archive and the krew
// manifest that names them with their checksums.
func writePlugin(o options, binaries map[string]string) error {
	var p krewPlugin
	p.APIVersion = "krew.googlecontainertools.github.com/v1alpha2"
	p.Kind = "Plugin"
	p.Metadata.Name = "flotilla"
	p.Spec.Version = o.version
	p.Spec.Homepage = "https://github.com/flotilla-io/flotilla"
	p.Spec.ShortDescription = "Operate a Flotilla federation of clusters"
	p.Spec.Description = "The flotilla CLI as a kubectl plugin: join clusters, list and accept peers,\n" +
		"offload namespaces, trace a path, verify and gather, with kubectl's\n" +
		"--context and --kubeconfig.\n"
	base := strings.ReplaceAll(o.downloadURL, "VERSION", o.version)
	for _, platform := range o.platforms {
		name := pluginArchive(platform)
		sum, err := writePluginArchive(binaries[platform], filepath.Join(o.out, name))
		if err != nil {
			return fmt.Errorf("plugin archive %s: %w", name, err)
		}
		goos, goarch, _ := strings.Cut(platform, "/")
		var kp krewPlatform
		kp.Selector.MatchLabels = map[string]string{"os": goos, "arch": goarch}
		kp.URI = strings.TrimSuffix(base, "/") + "/" + name
		kp.SHA256 = sum
		kp.Bin = pluginBinary
		kp.Files = append(kp.Files, struct {
			From string `json:"from"`
			To   string `json:"to"`
		}{pluginBinary, "."})
		p.Spec.Platforms = append(p.Spec.Platforms, kp)
	}
	out, err := yaml.Marshal(p)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, krewFile), out, 0o644)
}

// writePluginArchive writes binary as kubectl-flotilla into a gzipped tar
// at file, with fixed times so that one commit gives one archive, and
// returns the archive's SHA-256.
func writePluginArchive(binary, file string) (string, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	hdr := &tar.Header{Name: pluginBinary, Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return "", err
	}
	if _, err := tw.Write(data); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := gz.Close(); err != nil {
		return "", err
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	return hex.EncodeToString(sum[:]), nil
}
