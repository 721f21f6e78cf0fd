module github.com/onceonly/onceonly/tools/release

go 1.26.8

require golang.org/x/mod v0.42.0
