// Command image wraps a static binary into a one-layer image tarball on an
// empty base, without a container engine or a registry (`make image`):
//
//	go run ./hack/image -binary bin/flotilla-linux-amd64 -path /flotilla \
//	    -tag flotilla:v0.1.0 -o bin/flotilla-image.tar
//
// Load the result with `ctr -n k8s.io images import FILE` or `docker load`.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/flotilla-io/flotilla/internal/ociimage"
)

func main() {
	var s ociimage.Spec
	flag.StringVar(&s.Binary, "binary", "", "static linux/amd64 binary to put in the image")
	flag.StringVar(&s.Path, "path", "", "its path in the image, e.g. /flotilla")
	tag := flag.String("tag", "", "image name and tag, e.g. flotilla:v0.1.0")
	out := flag.String("o", "", "image tarball to write")
	dirs := flag.String("dirs", "/tmp", "comma-separated empty directories to create in the image")
	flag.Parse()
	if s.Binary == "" || s.Path == "" || *tag == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "image: -binary, -path, -tag and -o are required")
		flag.Usage()
		os.Exit(2)
	}
	if *dirs != "" {
		s.Dirs = strings.Split(*dirs, ",")
	}
	img, err := ociimage.Build(s)
	if err == nil {
		err = ociimage.Write(*out, *tag, img)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	// The config digest is the image ID that `crictl images` and `docker
	// images` show, whatever manifest the importer writes.
	id, _ := img.ConfigName()
	fmt.Printf("%s: %s, image ID %s\n", *out, *tag, id)
}
