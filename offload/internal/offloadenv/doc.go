// Package offloadenv is the two-cluster environment of the offloading
// tests: a consumer and a provider, real control planes with a real grant
// between them, and namespace mirroring running on both sides. It imports
// tenancy and mirror; the tests of the features above them use it.
package offloadenv
