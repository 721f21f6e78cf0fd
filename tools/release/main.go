// Command release keeps the workspace's modules (go.work) releasable in
// lockstep, as River does with its own: every requirement between them at
// one version, one go line, no replace directive. scripts/release.sh and
// scripts/publish-check.sh run it; see docs/development.md, "Releasing".
//
//	go run ./tools/release check               # the rules above; prints the version
//	go run ./tools/release requires v0.2.0     # every requirement between the modules
//	go run ./tools/release go 1.27.1           # the go line of go.work and every go.mod
//	go run ./tools/release publish DIR v0.2.0  # a file module proxy (GOPROXY=file://DIR)
//
// -C DIR (first) runs it on the workspace in DIR instead of the current
// directory. It is a module of its own, so that golang.org/x/mod is no
// requirement of the library's module.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

const usage = `usage: release [-C dir] check | requires VERSION | go VERSION | publish DIR VERSION`

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	root := "."
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
		fmt.Println(v)
		return nil
	case args[0] == "requires" && len(args) == 2:
		if !semver.IsValid(args[1]) || semver.Canonical(args[1]) != args[1] {
			return fmt.Errorf("%q is no canonical semantic version (vX.Y.Z)", args[1])
		}
		return ws.setRequires(args[1])
	case args[0] == "go" && len(args) == 2:
		return ws.setGo(args[1])
	case args[0] == "publish" && len(args) == 3:
		if !semver.IsValid(args[2]) || semver.Canonical(args[2]) != args[2] {
			return fmt.Errorf("%q is no canonical semantic version (vX.Y.Z)", args[2])
		}
		return ws.publish(args[1], args[2])
	}
	return errors.New(usage)
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

func load(root string) (*workspace, error) {
	ws := &workspace{root: root, workFile: filepath.Join(root, "go.work")}
	data, err := os.ReadFile(ws.workFile)
	if err != nil {
		return nil, err
	}
	if ws.work, err = modfile.ParseWork(ws.workFile, data, nil); err != nil {
		return nil, err
	}
	for _, u := range ws.work.Use {
		m := &mod{dir: filepath.Clean(u.Path), file: filepath.Join(root, u.Path, "go.mod")}
		data, err := os.ReadFile(m.file)
		if err != nil {
			return nil, err
		}
		if m.f, err = modfile.Parse(m.file, data, nil); err != nil {
			return nil, err
		}
		ws.mods = append(ws.mods, m)
	}
	return ws, nil
}

func (ws *workspace) isOurs(path string) bool {
	return slices.ContainsFunc(ws.mods, func(m *mod) bool { return m.f.Module.Mod.Path == path })
}

// check returns the one version every module requires the others at, or
// the first rule broken.
func (ws *workspace) check() (string, error) {
	if ws.work.Go == nil {
		return "", fmt.Errorf("%s has no go line", ws.workFile)
	}
	goLine, toolchain := ws.work.Go.Version, ""
	if ws.work.Toolchain != nil {
		toolchain = ws.work.Toolchain.Name
	}
	version, from := "", ""
	for _, m := range ws.mods {
		if m.f.Go == nil || m.f.Go.Version != goLine {
			return "", fmt.Errorf("%s: the go line must be go.work's (go %s); go run ./tools/release go %s", m.file, goLine, goLine)
		}
		tc := ""
		if m.f.Toolchain != nil {
			tc = m.f.Toolchain.Name
		}
		if tc != toolchain {
			return "", fmt.Errorf("%s: the toolchain line must be go.work's (%q)", m.file, toolchain)
		}
		if len(m.f.Replace) > 0 {
			return "", fmt.Errorf("%s: replace %s: no go.mod replaces (go.work is for development)", m.file, m.f.Replace[0].Old.Path)
		}
		for _, r := range m.f.Require {
			if !ws.isOurs(r.Mod.Path) {
				continue
			}
			if version == "" {
				version, from = r.Mod.Version, m.file
			}
			if r.Mod.Version != version || !semver.IsValid(version) || semver.Prerelease(version)+semver.Build(version) != "" {
				return "", fmt.Errorf("%s requires %s %s, %s requires %s: every module requires the others at one released version (scripts/release.sh)", m.file, r.Mod.Path, r.Mod.Version, from, version)
			}
		}
	}
	if err := ws.checkNested(); err != nil {
		return "", err
	}
	if version == "" {
		return "", errors.New("no module requires another")
	}
	return version, nil
}

// checkNested fails on a go.mod that git tracks outside go.work: it would
// be neither tagged nor published, and it would cut its directory out of
// the module around it.
func (ws *workspace) checkNested() error {
	out, err := exec.Command("git", "-C", ws.root, "ls-files", "--", "go.mod", "*/go.mod").Output()
	if err != nil {
		return nil // not a git checkout: nothing to compare
	}
	for _, f := range strings.Fields(string(out)) {
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

func (ws *workspace) setRequires(version string) error {
	for _, m := range ws.mods {
		for _, r := range m.f.Require {
			if ws.isOurs(r.Mod.Path) && r.Mod.Version != version {
				if err := m.f.AddRequire(r.Mod.Path, version); err != nil {
					return err
				}
			}
		}
		for _, r := range m.f.Replace {
			if ws.isOurs(r.Old.Path) {
				if err := m.f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
					return err
				}
			}
		}
		if err := m.write(); err != nil {
			return err
		}
	}
	return nil
}

func (ws *workspace) setGo(version string) error {
	if err := ws.work.AddGoStmt(version); err != nil {
		return err
	}
	ws.work.Cleanup()
	if err := os.WriteFile(ws.workFile, modfile.Format(ws.work.Syntax), 0o644); err != nil {
		return err
	}
	for _, m := range ws.mods {
		if err := m.f.AddGoStmt(version); err != nil {
			return err
		}
		if err := m.write(); err != nil {
			return err
		}
	}
	return nil
}

func (m *mod) write() error {
	m.f.Cleanup()
	data, err := m.f.Format()
	if err != nil {
		return err
	}
	old, err := os.ReadFile(m.file)
	if err == nil && bytes.Equal(old, data) {
		return nil
	}
	return os.WriteFile(m.file, data, 0o644)
}

// publish writes every module at version into dir laid out as a module
// proxy: the zip as a tag would publish it (zip.CreateFromDir leaves out
// nested modules and vendor directories, as the proxy does), the go.mod,
// the .info and the list.
func (ws *workspace) publish(dir, version string) error {
	now, _ := json.Marshal(struct{ Version, Time string }{version, time.Now().UTC().Format(time.RFC3339)})
	for _, m := range ws.mods {
		mv := module.Version{Path: m.f.Module.Mod.Path, Version: version}
		esc, err := module.EscapePath(mv.Path)
		if err != nil {
			return err
		}
		at := filepath.Join(dir, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(at, 0o755); err != nil {
			return err
		}
		z, err := os.Create(filepath.Join(at, version+".zip"))
		if err != nil {
			return err
		}
		if err := modzip.CreateFromDir(z, mv, filepath.Join(ws.root, m.dir)); err != nil {
			z.Close()
			return fmt.Errorf("%s: %w", mv, err)
		}
		if err := z.Close(); err != nil {
			return err
		}
		gomod, err := os.ReadFile(m.file)
		if err != nil {
			return err
		}
		for name, data := range map[string][]byte{version + ".mod": gomod, version + ".info": now, "list": []byte(version + "\n")} {
			if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}
