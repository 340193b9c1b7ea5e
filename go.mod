module github.com/flotilla-io/flotilla

go 1.25.0

require go.etcd.io/bbolt v1.4.2

require golang.org/x/sys v0.29.0
