// Package snippets holds the test that compiles the Go snippets of the
// docs (README.md, docs/*.md, docs/consumers/*.md): each block that is a
// program or a set of declarations is type-checked against the modules of
// this tree, so a guide cannot show an API that no longer exists or a name
// it never defines. The package has no code of its own.
package snippets
