package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// chartName is the chart's directory under charts/ and its name in
// Chart.yaml; a packaged chart is CHART-VERSION.tgz with everything under
// CHART/, as `helm package` writes it.
const chartName = "flotilla"

// chartFile is the packaged chart's name in a release: the chart's version
// is the release's without its v.
func chartFile(version string) string {
	return chartName + "-" + strings.TrimPrefix(version, "v") + ".tgz"
}

// writeChart packages the chart with the release's version and its image
// pinned to ref (repository@digest), which the values then name.
func writeChart(o options, ref string) error {
	dir := filepath.Join(o.src, o.chart)
	files, err := chartFiles(dir)
	if err != nil {
		return err
	}
	repo, digest, _ := strings.Cut(ref, "@")
	edits := map[string][][2]string{
		"Chart.yaml": {
			{"version: 0.0.0", "version: " + strings.TrimPrefix(o.version, "v")},
			{"appVersion: latest", "appVersion: " + o.version},
		},
		"values.yaml": {
			{"  repository: " + deployImage, "  repository: " + repo},
			{"  tag: latest", "  tag: " + o.version},
			{`  digest: ""`, "  digest: " + digest},
		},
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, name := range files {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("chart %s: %w", dir, err)
		}
		for _, e := range edits[name] {
			if data, err = replaceLine(data, e[0], e[1]); err != nil {
				return fmt.Errorf("chart %s: %s: %w", dir, name, err)
			}
		}
		// Fixed times and modes: one commit, one archive.
		hdr := &tar.Header{Name: path.Join(chartName, name), Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, chartFile(o.version)), buf.Bytes(), 0o644)
}

// replaceLine replaces the one line that reads old; a chart whose line
// changed is an error, not a chart released with the default image.
func replaceLine(data []byte, old, new string) ([]byte, error) {
	lines := strings.Split(string(data), "\n")
	n := 0
	for i, l := range lines {
		if l == old {
			lines[i] = new
			n++
		}
	}
	if n != 1 {
		return nil, fmt.Errorf("want one line %q to set, found %d", old, n)
	}
	return []byte(strings.Join(lines, "\n")), nil
}

// chartFiles lists the chart's files, symbolic links followed (files/ is
// deploy/), less those its .helmignore leaves out, in name order.
func chartFiles(dir string) ([]string, error) {
	ignore, err := readHelmignore(filepath.Join(dir, ".helmignore"))
	if err != nil {
		return nil, err
	}
	var out []string
	var walk func(rel string) error
	walk = func(rel string) error {
		entries, err := os.ReadDir(filepath.Join(dir, rel))
		if err != nil {
			return err
		}
		for _, e := range entries {
			name := path.Join(rel, e.Name())
			info, err := os.Stat(filepath.Join(dir, name)) // follows links
			if err != nil {
				return err
			}
			if ignore.match(name, info.IsDir()) {
				continue
			}
			if info.IsDir() {
				if err := walk(name); err != nil {
					return err
				}
				continue
			}
			if info.Mode().IsRegular() {
				out = append(out, name)
			}
		}
		return nil
	}
	if err := walk(""); err != nil {
		return nil, fmt.Errorf("chart %s: %w", dir, err)
	}
	slices.Sort(out)
	if !slices.Contains(out, "Chart.yaml") || !slices.Contains(out, "values.yaml") {
		return nil, fmt.Errorf("chart %s: no Chart.yaml or values.yaml", dir)
	}
	return out, nil
}

// helmignore is the part of .helmignore's syntax the chart uses: a
// pattern matches a file's base name (*.go), one ending in / a directory
// by its path in the chart (files/monitoring/).
type helmignore []string

func readHelmignore(file string) (helmignore, error) {
	f, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var h helmignore
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.ContainsAny(l, "!") || (strings.Contains(strings.TrimSuffix(l, "/"), "/") && !strings.HasSuffix(l, "/")) {
			return nil, fmt.Errorf("%s: pattern %q: only base-name globs and directory paths ending in / are understood", file, l)
		}
		h = append(h, l)
	}
	return h, sc.Err()
}

func (h helmignore) match(name string, dir bool) bool {
	for _, p := range h {
		if strings.HasSuffix(p, "/") {
			if dir && name == strings.TrimSuffix(p, "/") {
				return true
			}
			continue
		}
		if ok, _ := path.Match(p, path.Base(name)); ok || p == name {
			return true
		}
	}
	return name == ".helmignore"
}
