//go:build !unix

// Package cputime reads the CPU time the process has used, for benchmarks
// that report it beside their rates: on a shared machine it varies far
// less than wall time.
package cputime

import "time"

// Process is 0 where the process's CPU time is not read: benchmarks report
// no CPU time there.
func Process() time.Duration { return 0 }
