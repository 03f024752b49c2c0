// Command testservices starts the services of the test kit in containers,
// with testcontainers-go, for the tests of the modules of this repository.
// It reads service names, one a line, on its standard input ("postgres",
// "kafka") and answers each with one JSON line on stdout,
// {"addr": …, "where": …} once the service serves (a Postgres URL, or a
// broker's host:port), or {"error": …}. A service asked for again gets the
// same answer. When its standard input closes (the test process that started
// it has ended) it removes its containers and exits, except those shared by
// the processes of one run (EXACTLY_TESTENV_RUN, see Shared): the run removes
// those itself.
//
// The kit (internal/pgtest and internal/kafkatest, through
// internal/testenv.Container) runs it when no TEST_* service is set and a
// Docker engine may answer, so that testcontainers-go and the Docker client
// are requirements of this module only, not of the library's go.mod.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

type answer struct {
	Addr  string `json:"addr,omitempty"`
	Where string `json:"where,omitempty"`
	Error string `json:"error,omitempty"`
}

var services = map[string]func(context.Context) (testcontainers.Container, string, string, error){
	"postgres": runPostgres,
	"kafka":    runKafka,
}

func main() {
	if len(os.Args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: testservices (service names on stdin: postgres, kafka)")
		os.Exit(2)
	}
	// The test process that reads stdout and stderr may be gone when the
	// containers are removed (testcontainers logs to stderr then): a write
	// to its pipes must fail, not kill this process before the removal.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)

	var started []testcontainers.Container
	answers := map[string]answer{}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- strings.TrimSpace(sc.Text())
		}
		close(lines)
	}()
	enc := json.NewEncoder(os.Stdout)
loop:
	for {
		select {
		case <-sig:
			break loop
		case name, ok := <-lines:
			if !ok {
				break loop
			}
			ans, done := answers[name]
			if !done {
				ans = start(name, &started)
				answers[name] = ans
			}
			_ = enc.Encode(ans)
		}
	}
	if !shared() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, c := range started {
			_ = c.Terminate(ctx)
		}
	}
}

func start(name string, started *[]testcontainers.Container) answer {
	run, ok := services[name]
	if !ok {
		return answer{Error: fmt.Sprintf("testservices: unknown service %q (postgres, kafka)", name)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	if err := dockerAnswers(ctx); err != nil {
		return answer{Error: fmt.Sprintf("no Docker engine for testcontainers: %v", err)}
	}
	c, addr, where, err := run(ctx)
	if err != nil {
		return answer{Error: err.Error()}
	}
	*started = append(*started, c)
	return answer{Addr: addr, Where: where}
}

// dockerAnswers asks the engine testcontainers would use for its health.
func dockerAnswers(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("docker: %v", r)
		}
	}()
	p, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return p.Health(ctx)
}
