//go:build unix

package embedpg

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

type credential = syscall.Credential

// runAs returns the credential the server runs with: nil (the current user)
// unless that is root, which PostgreSQL refuses; then nobody's.
func runAs() (*credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	uid, gid := uint32(65534), uint32(65534)
	if u, err := user.Lookup("nobody"); err == nil {
		n, err1 := strconv.ParseUint(u.Uid, 10, 32)
		g, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 == nil && err2 == nil {
			uid, gid = uint32(n), uint32(g)
		}
	}
	return &credential{Uid: uid, Gid: gid, Groups: []uint32{}}, nil
}

// chownTree hands dir and everything in it to owner.
func chownTree(dir string, owner *credential) error {
	err := filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(owner.Uid), int(owner.Gid))
	})
	if err != nil {
		return fmt.Errorf("embedpg: hand %s to uid %d: %w", dir, owner.Uid, err)
	}
	return nil
}

// procAttr runs a child as owner (nil: as this process); a server gets its
// own process group and, on Linux, SIGQUIT (an immediate shutdown) when
// the program dies.
func procAttr(owner *credential, server bool) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Credential: owner, Setpgid: server}
	if server {
		setPdeathsig(a)
	}
	return a
}

// interrupt asks the postmaster for a fast shutdown.
func interrupt(p *os.Process) error { return p.Signal(syscall.SIGINT) }

// killGroup kills the postmaster and its children.
func killGroup(p *os.Process) error {
	if err := syscall.Kill(-p.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}
