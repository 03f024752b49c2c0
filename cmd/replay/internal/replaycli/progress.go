package replaycli

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// progress prints messages/s and an ETA once a second on a terminal; it is
// silent otherwise. A nil *progress is silent too.
type progress struct {
	w       io.Writer
	label   string
	total   int64
	n       atomic.Int64
	begun   time.Time
	stop    chan struct{}
	stopped sync.WaitGroup
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newProgress(w io.Writer) *progress {
	if !isTerminal(w) {
		return nil
	}
	return &progress{w: w}
}

func (p *progress) start(label string, total int64) {
	if p == nil {
		return
	}
	p.label, p.total, p.begun, p.stop = label, total, time.Now(), make(chan struct{})
	p.stopped.Add(1)
	go func() {
		defer p.stopped.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				p.print()
				fmt.Fprintln(p.w)
				return
			case <-t.C:
				p.print()
			}
		}
	}()
}

func (p *progress) print() {
	n := p.n.Load()
	secs := time.Since(p.begun).Seconds()
	rate := float64(n) / max(secs, 1e-9)
	eta := "?"
	if rate > 0 && p.total > n {
		eta = (time.Duration(float64(p.total-n)/rate) * time.Second).Round(time.Second).String()
	} else if p.total <= n {
		eta = "0s"
	}
	fmt.Fprintf(p.w, "\r%s %d/%d  %.0f msg/s  ETA %s   ", p.label, n, p.total, rate, eta)
}

func (p *progress) add(n int64) {
	if p != nil {
		p.n.Add(n)
	}
}

func (p *progress) done() {
	if p == nil || p.stop == nil {
		return
	}
	close(p.stop)
	p.stopped.Wait()
	p.stop = nil
}
