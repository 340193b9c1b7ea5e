package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
	// pluginLicense is the license file beside the binary in each
	// archive: krew's index accepts no plugin whose archives lack one.
	pluginLicense = "LICENSE"
	krewFile      = "flotilla.krew.yaml"
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
	URI    string       `json:"uri"`
	SHA256 string       `json:"sha256"`
	Bin    string       `json:"bin"`
	Files  []pluginFile `json:"files"`
}

// pluginFile is a file krew copies from the archive into the plugin's
// directory.
type pluginFile struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// writePlugin writes each CLI platform's plugin archive and the krew
// manifest that names them with their checksums.
func writePlugin(o options, binaries map[string]string) error {
	license, err := os.ReadFile(o.license)
	if err != nil {
		return err
	}
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
		sum, err := writePluginArchive(binaries[platform], license, filepath.Join(o.out, name))
		if err != nil {
			return fmt.Errorf("plugin archive %s: %w", name, err)
		}
		goos, goarch, _ := strings.Cut(platform, "/")
		var kp krewPlatform
		kp.Selector.MatchLabels = map[string]string{"os": goos, "arch": goarch}
		kp.URI = strings.TrimSuffix(base, "/") + "/" + name
		kp.SHA256 = sum
		kp.Bin = pluginBinary
		kp.Files = []pluginFile{{pluginBinary, "."}, {pluginLicense, "."}}
		p.Spec.Platforms = append(p.Spec.Platforms, kp)
	}
	out, err := yaml.Marshal(p)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, krewFile), out, 0o644)
}

// writePluginArchive writes binary as kubectl-flotilla and license as
// LICENSE into a gzipped tar at file, with fixed times so that one commit
// gives one archive, and returns the archive's SHA-256.
func writePluginArchive(binary string, license []byte, file string) (string, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{{pluginBinary, 0o755, data}, {pluginLicense, 0o644, license}} {
		hdr := &tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", err
		}
		if _, err := tw.Write(f.data); err != nil {
			return "", err
		}
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

// checkLicense refuses, before anything is built, a release whose plugin
// archives would have no license.
func checkLicense(file string) error {
	fi, err := os.Stat(file)
	if err == nil && (!fi.Mode().IsRegular() || fi.Size() == 0) {
		err = errors.New("not a non-empty regular file")
	}
	if err != nil {
		return fmt.Errorf("license %s: %v: krew accepts no plugin whose archives lack a license file; add the project's license as LICENSE at the module's root, or name the file with -license", file, err)
	}
	return nil
}
