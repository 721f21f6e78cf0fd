package snippets_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// imports maps the package names the snippets use to their import paths: a
// snippet shows no import block, the test adds the imports of the names it
// leaves undeclared.
var imports = map[string]string{
	"context":       "context",
	"errors":        "errors",
	"fmt":           "fmt",
	"http":          "net/http",
	"json":          "encoding/json",
	"log":           "log",
	"os":            "os",
	"slog":          "log/slog",
	"sql":           "database/sql",
	"strings":       "strings",
	"time":          "time",
	"onceonly":      "github.com/onceonly/onceonly",
	"client":        "github.com/onceonly/onceonly/client",
	"console":       "github.com/onceonly/onceonly/console",
	"migrations":    "github.com/onceonly/onceonly/migrations",
	"onceamqp":      "github.com/onceonly/onceonly/onceamqp",
	"oncekafka":     "github.com/onceonly/onceonly/oncekafka",
	"oncenats":      "github.com/onceonly/onceonly/oncenats",
	"onceriver":     "github.com/onceonly/onceonly/onceriver",
	"oncesqs":       "github.com/onceonly/onceonly/oncesqs",
	"oncewatermill": "github.com/onceonly/onceonly/oncewatermill",
	"amqp":          "github.com/rabbitmq/amqp091-go",
	"chi":           "github.com/go-chi/chi/v5",
	"jetstream":     "github.com/nats-io/nats.go/jetstream",
	"message":       "github.com/ThreeDotsLabs/watermill/message",
	"middleware":    "github.com/go-chi/chi/v5/middleware",
	"nats":          "github.com/nats-io/nats.go",
	"pgx":           "github.com/jackc/pgx/v5",
	"pgxpool":       "github.com/jackc/pgx/v5/pgxpool",
	"prometheus":    "github.com/prometheus/client_golang/prometheus",
	"redis":         "github.com/redis/go-redis/v9",
	"river":         "github.com/riverqueue/river",
	"riverpgxv5":    "github.com/riverqueue/river/riverdriver/riverpgxv5",
	"sqs":           "github.com/aws/aws-sdk-go-v2/service/sqs",
}

// importsIn overrides imports for one document.
var importsIn = map[string]map[string]string{
	"consumers/watermill.md": {"middleware": "github.com/ThreeDotsLabs/watermill/message/router/middleware"},
}

// excerpts are the documents whose Go blocks may be bare statements,
// because another test holds them to compiled code: README.md's example is
// lines of examples/quickstart/main.go (TestReadmeShowsThisProgram).
var excerpts = []string{"../README.md"}

// snippet is one ```go block of a document.
type snippet struct {
	line int // of the block's first line of code
	code string
}

// TestSnippetsCompile extracts every ```go block of README.md and the docs
// (docs/*.md, docs/consumers/*.md) and type-checks it (go vet) and checks it
// is gofmt'ed. A block is a program (it starts with "package"), compiled as
// a package of its own, or a set of declarations (functions, types,
// variables): the declarations of one document share a package, in order,
// so a later block may use an earlier one's. A block of bare statements is
// an error, but in the excerpts. Imports are added for the package names a
// block uses and does not declare; errors point at the document's lines.
// One go vet runs for all.
func TestSnippetsCompile(t *testing.T) {
	docs, err := filepath.Glob("../*.md")
	require.NoError(t, err)
	more, err := filepath.Glob("../consumers/*.md")
	require.NoError(t, err)
	docs = append(docs, more...)
	docs = append(docs, "../../README.md")

	//nolint:usetesting // not t.TempDir: inside the module, whose requirements resolve the imports
	dir, err := os.MkdirTemp(".", "_snippets-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })

	var pkgs []string
	checked := 0
	for _, doc := range docs {
		rel := strings.TrimPrefix(doc, "../")
		src, err := os.ReadFile(doc)
		require.NoError(t, err)
		decls := 0
		for i, s := range blocks(string(src)) {
			kind, err := classify(s.code)
			switch {
			case kind == "fragment" && slices.Contains(excerpts, rel):
				continue
			case kind == "fragment":
				t.Errorf("%s:%d: a Go snippet must be a program or a set of declarations (wrap statements in a function that declares what they use), so that it compiles: %v", rel, s.line, err)
				continue
			}
			if formatted := gofmt(s.code, kind); formatted != s.code {
				t.Errorf("%s:%d: the snippet is not gofmt'ed; as gofmt has it:\n%s", rel, s.line, formatted)
			}
			pkg := filepath.Join(dir, pkgName(rel))
			name := "decls"
			if kind == "program" {
				pkg = filepath.Join(dir, pkgName(rel)+"_program"+strconv.Itoa(i))
				name = "main"
			}
			require.NoError(t, os.MkdirAll(pkg, 0o750))
			file, err := source(rel, s, kind, name)
			require.NoError(t, err, "%s:%d", rel, s.line)
			require.NoError(t, os.WriteFile(filepath.Join(pkg, fmt.Sprintf("snippet%d.go", i)), file, 0o600))
			if kind == "program" || decls == 0 {
				pkgs = append(pkgs, "./"+filepath.ToSlash(pkg))
			}
			if kind == "decls" {
				decls++
			}
			checked++
		}
	}
	require.NotEmpty(t, pkgs)
	t.Logf("%d snippets in %d packages", checked, len(pkgs))
	vet := exec.CommandContext(t.Context(), "go", append([]string{"vet"}, pkgs...)...)
	out, err := vet.CombinedOutput()
	require.NoError(t, err, "the docs' snippets do not compile:\n%s", out)
}

// gofmt returns code as gofmt formats it (code itself when it does not
// parse: go vet says why).
func gofmt(code, kind string) string {
	clause := ""
	if kind == "decls" {
		clause = "package p\n"
	}
	out, err := format.Source([]byte(clause + code))
	if err != nil {
		return code
	}
	if clause == "" {
		return string(out)
	}
	return strings.TrimPrefix(string(out), clause+"\n") // gofmt puts a blank line after the clause
}

// blocks returns the ```go blocks of a Markdown document.
func blocks(src string) []snippet {
	var out []snippet
	var cur *snippet
	for n, line := range strings.Split(src, "\n") {
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &snippet{line: n + 2}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		}
	}
	return out
}

// classify says whether code is a program, a set of declarations, or a
// fragment (with the parse error that says why).
func classify(code string) (string, error) {
	if strings.HasPrefix(strings.TrimSpace(code), "package ") {
		return "program", nil
	}
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+code, 0); err != nil {
		return "fragment", err
	}
	return "decls", nil
}

// source returns the Go file of a snippet: a line directive so that errors
// name the document's lines, the package clause unless the snippet has its
// own, and the imports of the package names it uses and does not declare.
func source(doc string, s snippet, kind, pkg string) ([]byte, error) {
	code := s.code
	if kind == "decls" {
		code = "package " + pkg + "\n" + code
	}
	f, err := parser.ParseFile(token.NewFileSet(), "", code, parser.ImportsOnly)
	if err != nil {
		return nil, err
	}
	full, err := parser.ParseFile(token.NewFileSet(), "", code, 0)
	if err != nil {
		return nil, err
	}
	var paths []string
	if len(f.Imports) == 0 {
		for _, id := range undeclared(full) {
			path, ok := importsIn[doc][id]
			if !ok {
				path, ok = imports[id]
			}
			if ok {
				paths = append(paths, id+" "+strconv.Quote(path))
			}
		}
	}
	slices.SortFunc(paths, func(a, b string) int { // by path
		_, pa, _ := strings.Cut(a, " ")
		_, pb, _ := strings.Cut(b, " ")
		return strings.Compare(pa, pb)
	})
	var b bytes.Buffer
	clause, body, _ := strings.Cut(code, "\n")
	fmt.Fprintf(&b, "%s\n", clause)
	if len(paths) > 0 {
		fmt.Fprintf(&b, "import (\n\t%s\n)\n", strings.Join(paths, "\n\t"))
	}
	first := s.line
	if kind == "program" {
		first++ // the package clause was the block's first line
	}
	abs, err := filepath.Abs(filepath.Join("..", doc))
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(&b, "//line %s:%d\n%s", abs, first, body)
	return b.Bytes(), nil
}

// undeclared returns the names used as X in X.Sel that the file does not
// declare: the packages it needs.
func undeclared(f *ast.File) []string {
	var names []string
	for _, id := range f.Unresolved {
		if !slices.Contains(names, id.Name) {
			names = append(names, id.Name)
		}
	}
	return names
}

// pkgName turns a document's path into a package directory's name.
func pkgName(doc string) string {
	return strings.NewReplacer("../", "", "/", "_", ".md", "", "-", "_", ".", "_").Replace(doc)
}

// TestImportsRequired: every import path the snippets may get is imported
// by deps_test.go, so go mod tidy keeps its module in go.mod.
func TestImportsRequired(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "deps_test.go", nil, parser.ImportsOnly)
	require.NoError(t, err)
	have := make([]string, 0, len(f.Imports))
	for _, imp := range f.Imports {
		path, err := strconv.Unquote(imp.Path.Value)
		require.NoError(t, err)
		have = append(have, path)
	}
	want := slices.Collect(maps.Values(imports))
	for _, m := range importsIn {
		want = slices.AppendSeq(want, maps.Values(m))
	}
	for _, path := range want {
		if strings.Contains(strings.Split(path, "/")[0], ".") {
			require.Contains(t, have, path, "deps_test.go imports every path the snippets may use")
		}
	}
}
