module github.com/flotilla-io/flotilla

go 1.25.0
