//go:build !unix

package embedpg

import (
	"errors"
	"os"
	"syscall"
)

type credential struct{}

func runAs() (*credential, error) {
	return nil, errors.New("embedpg: a throwaway PostgreSQL server needs Linux or macOS here: run PostgreSQL and set DATABASE_URL")
}

func chownTree(string, *credential) error { return nil }

func procAttr(*credential, bool) *syscall.SysProcAttr { return nil }

func interrupt(p *os.Process) error { return p.Kill() }

func killGroup(p *os.Process) error { return p.Kill() }
