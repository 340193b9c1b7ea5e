package harness

import (
	"testing"

	"github.com/flotilla-io/flotilla/internal/ociimage"
)

// The suite's images read back under both names with every tool the
// suite's pods call (the build ran each in the root filesystem first).
func TestMCSSuiteImages(t *testing.T) {
	Require(t, Root, DebianTools)
	file := MCSSuiteImages(t)
	for _, tag := range []string{SocatImage, NetshootImage} {
		img, err := ociimage.Read(file, tag)
		if err != nil {
			t.Fatal(err)
		}
		files, err := ociimage.Files(img)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"/bin/sh", "/bin/grep", "/usr/bin/awk", "/usr/bin/tr", "/bin/sleep", "/usr/bin/socat", "/usr/bin/nslookup", "/bin/nc", "/tmp"} {
			if _, ok := files[f]; !ok {
				t.Errorf("%s: no %s", tag, f)
			}
		}
	}
}
