//go:build unix && !linux

package embedpg

import "syscall"

func setPdeathsig(*syscall.SysProcAttr) {}
