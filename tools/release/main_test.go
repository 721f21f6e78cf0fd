package main

import (
	"archive/zip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func write(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRequiresCheckPublish(t *testing.T) {
	root := t.TempDir()
	write(t, root, map[string]string{
		"go.work": "go 1.26.8\n\nuse (\n\t.\n\t./sub\n)\n",
		"go.mod":  "module example.com/lib\n\ngo 1.26.8\n",
		"lib.go":  "package lib\n",
		"sub/go.mod": "module example.com/lib/sub\n\ngo 1.26.8\n\nrequire example.com/lib v0.0.0-00010101000000-000000000000\n\n" +
			"require example.com/other v1.0.0 // indirect\n\nreplace example.com/lib => ../\n",
		"sub/sub.go": "package sub\n",
	})
	if err := run([]string{"-C", root, "check"}); err == nil || !strings.Contains(err.Error(), "replace") {
		t.Fatalf("check with a replace: %v", err)
	}
	if err := run([]string{"-C", root, "requires", "v0.3.0"}); err != nil {
		t.Fatal(err)
	}
	sub, _ := os.ReadFile(filepath.Join(root, "sub/go.mod"))
	if !strings.Contains(string(sub), "require example.com/lib v0.3.0\n") || strings.Contains(string(sub), "replace") ||
		!strings.Contains(string(sub), "example.com/other v1.0.0 // indirect") {
		t.Fatalf("sub/go.mod after requires:\n%s", sub)
	}
	work, _ := os.ReadFile(filepath.Join(root, "go.work"))
	if !strings.Contains(string(work), "replace example.com/lib v0.3.0 => ./\n") || strings.Contains(string(work), "lib/sub v0.3.0") {
		t.Fatalf("go.work after requires:\n%s", work)
	}
	ws, err := load(root)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := ws.check(); err != nil || v != "v0.3.0" {
		t.Fatalf("check: %q, %v", v, err)
	}
	write(t, root, map[string]string{"go.work": string(work) + "replace example.com/lib v0.2.0 => ./\n"})
	if err := run([]string{"-C", root, "check"}); err == nil || !strings.Contains(err.Error(), "go.work replaces example.com/lib v0.2.0") {
		t.Fatalf("check with a stale replace in go.work: %v", err)
	}
	write(t, root, map[string]string{"go.work": string(work)})

	proxy := t.TempDir()
	if err := run([]string{"-C", root, "publish", proxy, "v0.4.0"}); err != nil {
		t.Fatal(err)
	}
	z, err := zip.OpenReader(filepath.Join(proxy, "example.com/lib/@v/v0.4.0.zip"))
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	names := make([]string, 0, len(z.File))
	for _, f := range z.File {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	if want := []string{"example.com/lib@v0.4.0/go.mod", "example.com/lib@v0.4.0/go.work", "example.com/lib@v0.4.0/lib.go"}; !slices.Equal(names, want) {
		t.Fatalf("the root zip holds %v, want %v (the nested module left out)", names, want)
	}
	sums, _ := os.ReadFile(filepath.Join(proxy, "go.sum"))
	if n := strings.Count(string(sums), " h1:"); n != 4 {
		t.Fatalf("go.sum holds %d checksums, want 4:\n%s", n, sums)
	}
	for _, f := range []string{"example.com/lib/sub/@v/v0.4.0.mod", "example.com/lib/sub/@v/v0.4.0.info", "example.com/lib/sub/@v/list"} {
		if _, err := os.Stat(filepath.Join(proxy, f)); err != nil {
			t.Fatal(err)
		}
	}

	if err := run([]string{"-C", root, "go", "1.27.0"}); err != nil {
		t.Fatal(err)
	}
	write(t, root, map[string]string{"sub/go.mod": strings.Replace(string(sub), "go 1.26.8", "go 1.26.9", 1)})
	if err := run([]string{"-C", root, "check"}); err == nil || !strings.Contains(err.Error(), "go line") {
		t.Fatalf("check with two go lines: %v", err)
	}
}
