package onceonly_test

import (
	"bufio"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// architectureLeaves are the small packages ARCHITECTURE.md's graph leaves
// out: an import of one of them is no arrow.
var architectureLeaves = []string{"backoff", "startstop", "internal/defaults", "internal/promutil", "internal/pgretry", "internal/canonjson", "internal/schemaver"}

// TestArchitectureMatchesImports checks the dependency graph of
// ARCHITECTURE.md against the imports `go list` reports: every arrow is an
// import, and every import between the graph's packages (but of the small
// leaves) is an arrow, so the page cannot drift from the code.
func TestArchitectureMatchesImports(t *testing.T) {
	t.Parallel()
	drawn, nodes := architectureGraph(t)
	const module = "github.com/onceonly/onceonly"
	path := func(node string) string {
		if node == "onceonly" {
			return module
		}
		return module + "/" + node
	}
	pkgs := make([]string, 0, len(nodes))
	for _, n := range nodes {
		pkgs = append(pkgs, path(n))
	}
	out, err := exec.CommandContext(t.Context(), "go", append([]string{"list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}"}, pkgs...)...).Output()
	require.NoError(t, err, "go list %v", pkgs)

	var actual []string
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		from := strings.TrimPrefix(strings.TrimPrefix(fields[0], module), "/")
		if from == "" {
			from = "onceonly"
		}
		for _, imp := range fields[1:] {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := strings.TrimPrefix(strings.TrimPrefix(imp, module), "/")
			if to == "" {
				to = "onceonly"
			}
			if slices.Contains(architectureLeaves, to) {
				continue
			}
			require.Contains(t, nodes, to, "%s imports %s, which ARCHITECTURE.md's graph does not show", from, to)
			actual = append(actual, from+" --> "+to)
		}
	}
	slices.Sort(actual)
	require.Equal(t, actual, drawn, "ARCHITECTURE.md's arrows (right) against go list's imports (left)")
}

// architectureGraph reads the mermaid graph of ARCHITECTURE.md: its arrows
// ("a --> b", sorted, by package path below the module) and its nodes.
func architectureGraph(t *testing.T) (arrows, nodes []string) {
	t.Helper()
	f, err := os.Open("ARCHITECTURE.md")
	require.NoError(t, err)
	defer f.Close()
	node := regexp.MustCompile(`(\w+)(?:\["([^"]+)"\])?`)
	label := map[string]string{}
	var edges [][2][]string
	in := false
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "```mermaid":
			in = true
		case line == "```":
			in = false
		case in && strings.Contains(line, "-->"):
			left, right, _ := strings.Cut(line, "-->")
			var sides [2][]string
			for i, side := range []string{left, right} {
				for _, m := range node.FindAllStringSubmatch(side, -1) {
					if m[2] != "" {
						label[m[1]] = m[2]
					}
					sides[i] = append(sides[i], m[1])
				}
			}
			edges = append(edges, sides)
		}
	}
	name := func(id string) string {
		if l, ok := label[id]; ok {
			return l
		}
		return id
	}
	for _, e := range edges {
		for _, from := range e[0] {
			for _, to := range e[1] {
				arrows = append(arrows, name(from)+" --> "+name(to))
				nodes = append(nodes, name(from), name(to))
			}
		}
	}
	slices.Sort(arrows)
	slices.Sort(nodes)
	return slices.Compact(arrows), slices.Compact(nodes)
}
