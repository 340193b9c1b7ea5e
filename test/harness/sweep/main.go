// Command sweep removes what killed test runs left behind: network
// namespaces, processes and temporary directories of runs whose lock is no
// longer held. Live runs are not touched.
package main

import (
	"fmt"
	"os"

	"github.com/flotilla-io/flotilla/test/harness"
)

func main() {
	if err := harness.Sweep(); err != nil {
		fmt.Fprintln(os.Stderr, "sweep:", err)
		os.Exit(1)
	}
}
