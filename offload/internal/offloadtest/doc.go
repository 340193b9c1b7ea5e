// Package offloadtest holds the fixtures the offloading packages' tests
// share: CRDs applied to real control planes, controllers run until the
// test ends, credentials held by hand, fixed views, and the like. It
// imports no feature package, so each may use it in its own tests.
package offloadtest
