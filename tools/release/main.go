// Command release keeps the workspace's modules (go.work) releasable in
// lockstep, as River does with its own: every requirement between them at
// one version, one go line, no replace directive in a go.mod. go.work maps
// that version of each required module to its directory, so the workspace
// builds whether or not the version is published (go.work is for
// development only: a published module ignores it).
// scripts/release.sh and scripts/publish-check.sh run it; see
// docs/development.md, "Releasing".
//
//	release check               # the rules above; prints the version
//	release requires v0.2.0     # every requirement between the modules, and go.work's replaces
//	release go 1.27.1           # the go line of go.work and every go.mod
//	release modules             # module path and directory, one module a line
//	release publish DIR v0.2.0  # a file module proxy (GOPROXY=file://DIR), and DIR/go.sum
//
// It works on the workspace around the current directory, or in the one
// -C DIR (first) names. It is a module of its own that requires none of
// the others, so that golang.org/x/mod is no requirement of theirs and so
// that it runs, with GOWORK=off, even when the workspace does not load:
//
//	GOWORK=off go -C tools/release run . check
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

const usage = `usage: release [-C dir] check | requires VERSION | go VERSION | modules | publish DIR VERSION`

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	root := ""
	if len(args) >= 2 && args[0] == "-C" {
		root, args = args[1], args[2:]
	}
	if len(args) == 0 {
		return errors.New(usage)
	}
	ws, err := load(root)
	if err != nil {
		return err
	}
	switch {
	case args[0] == "check" && len(args) == 1:
		v, err := ws.check()
		if err != nil {
			return err
		}
		fmt.Fprintln(os.Stdout, v)
		return nil
	case args[0] == "requires" && len(args) == 2:
		if err := released(args[1]); err != nil {
			return err
		}
		return ws.setRequires(args[1])
	case args[0] == "go" && len(args) == 2:
		return ws.setGo(args[1])
	case args[0] == "modules" && len(args) == 1:
		for _, m := range ws.mods {
			fmt.Fprintf(os.Stdout, "%s\t%s\n", m.path(), m.dir)
		}
		return nil
	case args[0] == "publish" && len(args) == 3:
		if err := released(args[2]); err != nil {
			return err
		}
		return ws.publish(args[1], args[2])
	}
	return errors.New(usage)
}

// released accepts the versions a release tags: vX.Y.Z, no pre-release.
func released(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Prerelease(v) != "" {
		return fmt.Errorf("%q is not a release version (vX.Y.Z)", v)
	}
	return nil
}

// workspace is go.work and the go.mod of every module it uses.
type workspace struct {
	root     string
	workFile string
	work     *modfile.WorkFile
	mods     []*mod
}

type mod struct {
	dir  string // relative to the root, "." for the root module
	file string
	f    *modfile.File
}

// name is the go.mod's path from the root, for messages.
func (m *mod) name() string { return filepath.Join(m.dir, "go.mod") }

func (m *mod) path() string { return m.f.Module.Mod.Path }

// local is the directory as go.work's replace names it: ./ or ./oncenats.
func (m *mod) local() string {
	if m.dir == "." {
		return "./"
	}
	return "./" + filepath.ToSlash(m.dir)
}

func load(root string) (*workspace, error) {
	if root == "" {
		dir, err := os.Getwd()
		if err != nil {
			return nil, fmt.Errorf("the current directory: %w", err)
		}
		for root = dir; ; root = filepath.Dir(root) {
			if _, err := os.Stat(filepath.Join(root, "go.work")); err == nil {
				break
			}
			if filepath.Dir(root) == root {
				return nil, fmt.Errorf("no go.work in %s or above", dir)
			}
		}
	}
	ws := &workspace{root: root, workFile: filepath.Join(root, "go.work")}
	data, err := os.ReadFile(ws.workFile)
	if err != nil {
		return nil, fmt.Errorf("reading go.work: %w", err)
	}
	if ws.work, err = modfile.ParseWork(ws.workFile, data, nil); err != nil {
		return nil, fmt.Errorf("parsing go.work: %w", err)
	}
	for _, u := range ws.work.Use {
		m := &mod{dir: filepath.Clean(u.Path), file: filepath.Join(root, u.Path, "go.mod")}
		data, err := os.ReadFile(m.file)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", m.name(), err)
		}
		if m.f, err = modfile.Parse(m.file, data, nil); err != nil {
			return nil, fmt.Errorf("parsing %s: %w", m.name(), err)
		}
		ws.mods = append(ws.mods, m)
	}
	return ws, nil
}

func (ws *workspace) ours(path string) *mod {
	for _, m := range ws.mods {
		if m.path() == path {
			return m
		}
	}
	return nil
}

// required lists the modules of the workspace that another requires.
func (ws *workspace) required() []*mod {
	var req []*mod
	for _, m := range ws.mods {
		for _, r := range m.f.Require {
			if o := ws.ours(r.Mod.Path); o != nil && !slices.Contains(req, o) {
				req = append(req, o)
			}
		}
	}
	return req
}

// check returns the one version every module requires the others at, or
// the first rule broken.
func (ws *workspace) check() (string, error) {
	if ws.work.Go == nil {
		return "", errors.New("go.work has no go line")
	}
	goLine, toolchain := ws.work.Go.Version, ""
	if ws.work.Toolchain != nil {
		toolchain = ws.work.Toolchain.Name
	}
	version, from := "", ""
	for _, m := range ws.mods {
		if m.f.Go == nil || m.f.Go.Version != goLine {
			return "", fmt.Errorf("%s: the go line is not go.work's, go %s (GOWORK=off go -C tools/release run . go %s)", m.name(), goLine, goLine)
		}
		tc := ""
		if m.f.Toolchain != nil {
			tc = m.f.Toolchain.Name
		}
		if tc != toolchain {
			return "", fmt.Errorf("%s: the toolchain line is not go.work's (%q)", m.name(), toolchain)
		}
		if len(m.f.Replace) > 0 {
			return "", fmt.Errorf("%s: replace %s: no go.mod replaces anything (go.work is for development)", m.name(), m.f.Replace[0].Old.Path)
		}
		for _, r := range m.f.Require {
			if ws.ours(r.Mod.Path) == nil {
				continue
			}
			if version == "" {
				version, from = r.Mod.Version, m.name()
				if err := released(version); err != nil {
					return "", fmt.Errorf("%s requires %s %s: %w", m.name(), r.Mod.Path, version, err)
				}
			}
			if r.Mod.Version != version {
				return "", fmt.Errorf("%s requires %s %s, %s requires %s: the modules require one another at one version (scripts/release.sh)", m.name(), r.Mod.Path, r.Mod.Version, from, version)
			}
		}
	}
	if version == "" {
		return "", errors.New("no module requires another")
	}
	for _, m := range ws.required() {
		if !slices.ContainsFunc(ws.work.Replace, func(r *modfile.Replace) bool {
			return r.Old.Path == m.path() && r.Old.Version == version && r.New.Version == "" && filepath.Clean(r.New.Path) == m.dir
		}) {
			return "", fmt.Errorf("go.work does not replace %s %s => %s (GOWORK=off go -C tools/release run . requires %s)", m.path(), version, m.local(), version)
		}
	}
	for _, r := range ws.work.Replace {
		if o := ws.ours(r.Old.Path); o == nil || r.Old.Version != version || !slices.Contains(ws.required(), o) {
			return "", fmt.Errorf("go.work replaces %s %s: only the version the modules require, of a module another requires (GOWORK=off go -C tools/release run . requires %s)", r.Old.Path, r.Old.Version, version)
		}
	}
	return version, ws.checkNested()
}

// checkNested fails on a go.mod that git tracks outside go.work: it would
// be neither tagged nor published, and it would cut its directory out of
// the module around it.
func (ws *workspace) checkNested() error {
	out, err := exec.CommandContext(context.Background(), "git", "-C", ws.root, "ls-files", "--", "go.mod", "*/go.mod").Output()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return nil // not a git checkout: nothing to compare
	case err != nil:
		return fmt.Errorf("git ls-files: %w", err)
	}
	for f := range strings.FieldsSeq(string(out)) {
		dir := filepath.Dir(f)
		if slices.Contains(strings.Split(filepath.ToSlash(dir), "/"), "testdata") {
			continue
		}
		if !slices.ContainsFunc(ws.mods, func(m *mod) bool { return m.dir == dir }) {
			return fmt.Errorf("%s is not in go.work: every module of the repository is in the workspace", f)
		}
	}
	return nil
}

// setRequires sets every requirement between the modules to version, drops
// every go.mod replace of one of them, and makes go.work replace version of
// each required module with its directory.
func (ws *workspace) setRequires(version string) error {
	for _, m := range ws.mods {
		for _, r := range m.f.Require {
			if ws.ours(r.Mod.Path) != nil && r.Mod.Version != version {
				if err := m.f.AddRequire(r.Mod.Path, version); err != nil {
					return fmt.Errorf("%s: require %s %s: %w", m.name(), r.Mod.Path, version, err)
				}
			}
		}
		for _, r := range slices.Clone(m.f.Replace) {
			if ws.ours(r.Old.Path) != nil {
				if err := m.f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
					return fmt.Errorf("%s: dropping replace %s: %w", m.name(), r.Old.Path, err)
				}
			}
		}
		if err := m.write(); err != nil {
			return err
		}
	}
	for _, r := range slices.Clone(ws.work.Replace) {
		if ws.ours(r.Old.Path) != nil {
			if err := ws.work.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				return fmt.Errorf("go.work: dropping replace %s: %w", r.Old.Path, err)
			}
		}
	}
	for _, m := range ws.required() {
		if err := ws.work.AddReplace(m.path(), version, m.local(), ""); err != nil {
			return fmt.Errorf("go.work: replace %s %s: %w", m.path(), version, err)
		}
	}
	return ws.writeWork()
}

func (ws *workspace) setGo(version string) error {
	if err := ws.work.AddGoStmt(version); err != nil {
		return fmt.Errorf("go.work: go %s: %w", version, err)
	}
	if err := ws.writeWork(); err != nil {
		return err
	}
	for _, m := range ws.mods {
		if err := m.f.AddGoStmt(version); err != nil {
			return fmt.Errorf("%s: go %s: %w", m.name(), version, err)
		}
		if err := m.write(); err != nil {
			return err
		}
	}
	return nil
}

func (ws *workspace) writeWork() error {
	ws.work.Cleanup()
	return writeIfChanged(ws.workFile, modfile.Format(ws.work.Syntax))
}

func (m *mod) write() error {
	m.f.Cleanup()
	data, err := m.f.Format()
	if err != nil {
		return fmt.Errorf("formatting %s: %w", m.name(), err)
	}
	return writeIfChanged(m.file, data)
}

// writeIfChanged keeps the file's mode; a new file is the owner's only.
func writeIfChanged(file string, data []byte) error {
	if old, err := os.ReadFile(file); err == nil && bytes.Equal(old, data) {
		return nil
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	return nil
}

// publish writes every module at version into dir laid out as a module
// proxy: the zip as a tag would publish it (zip.CreateFromDir leaves out
// nested modules and vendor directories, as the proxy does), the go.mod,
// the .info and the list; and dir/go.sum, their checksums.
func (ws *workspace) publish(dir, version string) error {
	info, err := json.Marshal(map[string]string{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
	if err != nil {
		return fmt.Errorf("the .info file: %w", err)
	}
	var sums bytes.Buffer
	for _, m := range ws.mods {
		mv := module.Version{Path: m.path(), Version: version}
		line, err := publishModule(dir, filepath.Join(ws.root, m.dir), mv, info)
		if err != nil {
			return fmt.Errorf("publishing %s: %w", mv, err)
		}
		sums.WriteString(line)
	}
	return writeIfChanged(filepath.Join(dir, "go.sum"), sums.Bytes())
}

// publishModule writes the module in src as mv into the proxy in dir and
// returns its go.sum lines.
func publishModule(dir, src string, mv module.Version, info []byte) (string, error) {
	esc, err := module.EscapePath(mv.Path)
	if err != nil {
		return "", fmt.Errorf("escaping the path: %w", err)
	}
	at := filepath.Join(dir, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(at, 0o750); err != nil {
		return "", fmt.Errorf("the proxy's directory: %w", err)
	}
	zipFile := filepath.Join(at, mv.Version+".zip")
	z, err := os.Create(zipFile)
	if err != nil {
		return "", fmt.Errorf("the zip: %w", err)
	}
	if err := modzip.CreateFromDir(z, mv, src); err != nil {
		z.Close()
		return "", fmt.Errorf("zipping: %w", err)
	}
	if err := z.Close(); err != nil {
		return "", fmt.Errorf("the zip: %w", err)
	}
	gomod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("reading go.mod: %w", err)
	}
	for name, data := range map[string][]byte{mv.Version + ".mod": gomod, mv.Version + ".info": info, "list": []byte(mv.Version + "\n")} {
		if err := writeIfChanged(filepath.Join(at, name), data); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
	}
	zipSum, err := dirhash.HashZip(zipFile, dirhash.Hash1)
	if err != nil {
		return "", fmt.Errorf("the zip's checksum: %w", err)
	}
	modSum, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gomod)), nil
	})
	if err != nil {
		return "", fmt.Errorf("go.mod's checksum: %w", err)
	}
	return fmt.Sprintf("%s %s %s\n%s %s/go.mod %s\n", mv.Path, mv.Version, zipSum, mv.Path, mv.Version, modSum), nil
}
