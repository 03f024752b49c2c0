// Command modproxy writes a file-based Go module proxy (GOPROXY=file://DIR)
// serving one version of each module directory given: for each, the .info,
// .mod and .zip files and the list file, the zip made by golang.org/x/mod/zip
// as the go command makes it from a tagged repository.
//
//	modproxy -out DIR -version v0.1.0-rc.1 DIR...
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	out := flag.String("out", "", "proxy directory")
	version := flag.String("version", "", "version of every module")
	flag.Parse()
	if *out == "" || *version == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: modproxy -out DIR -version VERSION MODULEDIR...")
		os.Exit(2)
	}
	for _, dir := range flag.Args() {
		if err := write(*out, *version, dir); err != nil {
			fmt.Fprintf(os.Stderr, "modproxy: %s: %v\n", dir, err)
			os.Exit(1)
		}
	}
}

func write(out, version, dir string) error {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	path := modfile.ModulePath(gomod)
	if path == "" {
		return fmt.Errorf("go.mod has no module line")
	}
	m := module.Version{Path: path, Version: version}
	if err := module.Check(path, version); err != nil {
		return err
	}
	esc, err := module.EscapePath(path)
	if err != nil {
		return err
	}
	escv, err := module.EscapeVersion(version)
	if err != nil {
		return err
	}
	vdir := filepath.Join(out, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err := os.WriteFile(filepath.Join(vdir, escv+".info"), info, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, escv+".mod"), gomod, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, "list"), []byte(version+"\n"), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(vdir, escv+".zip"))
	if err != nil {
		return err
	}
	if err := zip.CreateFromDir(f, m, dir); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
