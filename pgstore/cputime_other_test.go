//go:build !unix

package pgstore_test

import "time"

// cpuTime is 0 where the process's CPU time is not read: the benchmark
// reports no CPU time per key there.
func cpuTime() time.Duration { return 0 }
