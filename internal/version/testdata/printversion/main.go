// Command printversion prints the build the linker stamped, as JSON: the
// smallest program that shows what -X did to internal/version.
package main

import (
	"encoding/json"
	"os"

	"github.com/flotilla-io/flotilla/internal/version"
)

func main() {
	_ = json.NewEncoder(os.Stdout).Encode(version.Get())
}
