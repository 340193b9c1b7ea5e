// Command image wraps a static binary into a one-layer image tarball on an
// empty base, without a container engine or a registry (`make image`):
//
//	go run ./hack/image -binary bin/flotilla-linux-amd64 -path /flotilla \
//	    -tag flotilla:v0.1.0 -o bin/flotilla-image.tar
//
// Load the result with `ctr -n k8s.io images import FILE` or `docker load`.
// -platform linux/arm64 makes the image of an arm64 binary; `make release`
// puts one image per platform under an image index (internal/ociimage).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/flotilla-io/flotilla/internal/ociimage"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	var s ociimage.Spec
	fs.StringVar(&s.Binary, "binary", "", "static binary to put in the image")
	fs.StringVar(&s.Platform, "platform", "linux/amd64", "the binary's os/arch, e.g. linux/arm64")
	fs.StringVar(&s.Path, "path", "", "its path in the image, e.g. /flotilla")
	tag := fs.String("tag", "", "image name and tag, e.g. flotilla:v0.1.0")
	out := fs.String("o", "", "image tarball to write")
	dirs := fs.String("dirs", "/tmp", "comma-separated empty directories to create in the image")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if s.Binary == "" || s.Path == "" || *tag == "" || *out == "" {
		return errors.New("-binary, -path, -tag and -o are required")
	}
	if *dirs != "" {
		s.Dirs = strings.Split(*dirs, ",")
	}
	img, err := ociimage.Build(s)
	if err != nil {
		return err
	}
	if err := ociimage.Write(*out, *tag, img); err != nil {
		return err
	}
	// The config digest is the image ID that `crictl images` and `docker
	// images` show, whatever manifest the importer writes.
	id, err := img.ConfigName()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s, image ID %s\n", *out, *tag, id)
	return nil
}
