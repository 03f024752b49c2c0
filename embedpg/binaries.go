package embedpg

// Where the server binaries come from: the machine's own PostgreSQL, or the
// io.zonky.test.postgres builds on Maven Central, fetched once and cached.

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"github.com/ulikunitz/xz"
)

// machineBinDir finds an installed PostgreSQL server, or returns "".
func machineBinDir() string {
	has := func(dir string) bool {
		for _, exe := range []string{"postgres", "initdb"} {
			if fi, err := os.Stat(filepath.Join(dir, exe)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); has(d) {
			return d
		}
	}
	// Debian and Ubuntu keep each major version apart; the newest wins.
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	major := func(d string) int { n, _ := strconv.Atoi(filepath.Base(filepath.Dir(d))); return n }
	sort.Slice(dirs, func(i, j int) bool { return major(dirs[i]) > major(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d
		}
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(r)) {
			return filepath.Dir(r)
		}
	}
	return ""
}

// platform names the binaries' artifact for this machine.
func platform() (string, error) {
	arch := map[string]string{"amd64": "amd64", "arm64": "arm64v8", "386": "i386", "ppc64le": "ppc64le"}[runtime.GOARCH]
	if (runtime.GOOS != "linux" && runtime.GOOS != "darwin") || arch == "" {
		return "", fmt.Errorf("embedpg: no PostgreSQL binaries for %s/%s on Maven Central: install PostgreSQL and set Config.BinDir", runtime.GOOS, runtime.GOARCH)
	}
	return runtime.GOOS + "-" + arch, nil
}

// fetch returns the path of the cached, decompressed tarball of the
// binaries, downloading and checking it first if needed.
func fetch(ctx context.Context, c *Config) (string, error) {
	plat, err := platform()
	if err != nil {
		return "", err
	}
	cached := filepath.Join(c.CacheDir, "postgres-"+c.Version+"-"+plat+".tar")
	if _, err := os.Stat(cached); err == nil {
		return cached, nil
	}
	artifact := "embedded-postgres-binaries-" + plat
	url := fmt.Sprintf("%s/io/zonky/test/postgres/%s/%s/%s-%s.jar", strings.TrimSuffix(c.Repository, "/"), artifact, c.Version, artifact, c.Version)
	c.Logger.Info("embedpg: fetching PostgreSQL binaries (once; cached)", "url", url, "cache", cached)
	jar, err := get(ctx, url)
	if err != nil {
		return "", err
	}
	sum, err := get(ctx, url+".sha1")
	if err != nil {
		return "", err
	}
	if got, want := sha1.Sum(jar), strings.TrimSpace(string(sum)); !strings.HasPrefix(want, hex.EncodeToString(got[:])) {
		return "", fmt.Errorf("embedpg: %s: checksum %x, want %s", url, got, want)
	}
	zr, err := zip.NewReader(bytes.NewReader(jar), int64(len(jar)))
	if err != nil {
		return "", fmt.Errorf("embedpg: %s: %w", url, err)
	}
	var txz *zip.File
	for _, f := range zr.File {
		if strings.HasSuffix(f.Name, ".txz") {
			txz = f
		}
	}
	if txz == nil {
		return "", fmt.Errorf("embedpg: %s holds no .txz archive", url)
	}
	rc, err := txz.Open()
	if err != nil {
		return "", fmt.Errorf("embedpg: %s: %w", url, err)
	}
	defer rc.Close()
	xr, err := xz.NewReader(rc)
	if err != nil {
		return "", fmt.Errorf("embedpg: %s: %w", url, err)
	}
	if err := os.MkdirAll(c.CacheDir, 0o755); err != nil {
		return "", fmt.Errorf("embedpg: %w", err)
	}
	tmp, err := os.CreateTemp(c.CacheDir, ".postgres-*.tar")
	if err != nil {
		return "", fmt.Errorf("embedpg: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, xr)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), cached)
	}
	if err != nil {
		return "", fmt.Errorf("embedpg: unpack %s: %w", url, err)
	}
	return cached, nil
}

func get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("embedpg: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("embedpg: fetch PostgreSQL binaries: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("embedpg: fetch %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("embedpg: fetch %s: %w", url, err)
	}
	return b, nil
}

// untar unpacks a tarball of the binaries into dst, refusing entries that
// would land outside it.
func untar(tarball, dst string) error {
	f, err := os.Open(tarball)
	if err != nil {
		return fmt.Errorf("embedpg: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("embedpg: %s: %w", tarball, err)
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			return fmt.Errorf("embedpg: %s: entry %q leaves the directory", tarball, h.Name)
		}
		path := filepath.Join(dst, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("embedpg: %w", err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(path, 0o755)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, path)
		case tar.TypeLink:
			if !filepath.IsLocal(filepath.Clean(h.Linkname)) {
				return fmt.Errorf("embedpg: %s: link %q leaves the directory", tarball, h.Linkname)
			}
			err = os.Link(filepath.Join(dst, filepath.Clean(h.Linkname)), path)
		case tar.TypeReg:
			var out *os.File
			out, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o755|0o400)
			if err == nil {
				_, err = io.Copy(out, tr)
				err = errors.Join(err, out.Close())
			}
		}
		if err != nil {
			return fmt.Errorf("embedpg: unpack %s: %w", h.Name, err)
		}
	}
}
