package main

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

// bundle is where gather writes: a directory or a .tar.gz file.
type bundle interface {
	add(name string, data []byte) error
	close() error
}

// openBundle opens to: a name ending .tar.gz is an archive, anything
// else a directory. Neither may exist yet, so that nothing is
// overwritten.
func openBundle(to string) (bundle, error) {
	if _, err := os.Lstat(to); err == nil {
		return nil, fmt.Errorf("-o %s: it exists; name a new directory or file", to)
	}
	if strings.HasSuffix(to, ".tar.gz") || strings.HasSuffix(to, ".tgz") {
		f, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, err
		}
		gz := gzip.NewWriter(f)
		root := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(to), ".tar.gz"), ".tgz")
		return &tarBundle{f: f, gz: gz, tw: tar.NewWriter(gz), root: root, now: time.Now()}, nil
	}
	if err := os.MkdirAll(to, 0o700); err != nil {
		return nil, err
	}
	return dirBundle(to), nil
}

type dirBundle string

func (d dirBundle) add(name string, data []byte) error {
	p := filepath.Join(string(d), filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return os.WriteFile(p, data, 0o600)
}

func (dirBundle) close() error { return nil }

type tarBundle struct {
	f    *os.File
	gz   *gzip.Writer
	tw   *tar.Writer
	root string
	now  time.Time
}

func (t *tarBundle) add(name string, data []byte) error {
	h := &tar.Header{Name: t.root + "/" + name, Mode: 0o600, Size: int64(len(data)), ModTime: t.now, Typeflag: tar.TypeReg}
	if err := t.tw.WriteHeader(h); err != nil {
		return err
	}
	_, err := t.tw.Write(data)
	return err
}

func (t *tarBundle) close() error {
	return errors.Join(t.tw.Close(), t.gz.Close(), t.f.Close())
}

// podLogClient reads pods' logs.
func podLogClient(cfg *rest.Config) (corev1client.CoreV1Interface, error) {
	return corev1client.NewForConfig(cfg)
}
