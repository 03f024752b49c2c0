package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/exactly-go/exactly/internal/kafkaadmin"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// The images, as pgtest.Image and kafkatest.Image name them (not imported:
// that would bring the rest of the kit into this module); they match
// docker-compose.yml, and scripts/docker-images.sh builds them where no
// registry answers.
const (
	postgresImage = "postgres:15-alpine"
	kafkaImage    = "apache/kafka:4.4.0"
)

func runLabel() string {
	if v := os.Getenv("EXACTLY_TESTENV_RUN"); v != "" {
		return v
	}
	return strconv.Itoa(os.Getppid())
}

// Loopback is the option every container of the kit takes: host networking
// (no port is published and nothing connects to a bridge address; the
// service must be told which 127.0.0.1 port to listen on) and the kit's
// label (testenv.ContainerLabel: the test process's pid, or
// $EXACTLY_TESTENV_RUN), so a run with the Ryuk reaper disabled can remove
// them afterwards.
func Loopback() testcontainers.CustomizeRequestOption {
	return func(req *testcontainers.GenericContainerRequest) error {
		req.ExposedPorts = nil
		req.Networks = nil
		req.NetworkAliases = nil
		prev := req.HostConfigModifier
		req.HostConfigModifier = func(hc *container.HostConfig) {
			if prev != nil {
				prev(hc)
			}
			hc.NetworkMode = "host"
			hc.PortBindings = nil
			hc.PublishAllPorts = false
		}
		// testcontainers attaches every container to its default network
		// (creating a bridge when the engine has none): detach it.
		prevEndpoints := req.EndpointSettingsModifier
		req.EndpointSettingsModifier = func(es map[string]*network.EndpointSettings) {
			if prevEndpoints != nil {
				prevEndpoints(es)
			}
			clear(es)
		}
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		req.Labels[testenv.ContainerLabel] = runLabel()
		return nil
	}
}

func shared() bool { return os.Getenv("EXACTLY_TESTENV_RUN") != "" }

// Shared makes the test processes of one run (EXACTLY_TESTENV_RUN set) share
// one container of service, found by name, instead of one per package: the
// tests isolate themselves (a schema, topics and groups of their own), and a
// broker's start-up costs a minute on a loaded machine. The first process
// creates it; the others reuse it and read its ports from its environment
// (containerEnv). Without EXACTLY_TESTENV_RUN, each process has its own.
func Shared(service string) testcontainers.CustomizeRequestOption {
	return func(req *testcontainers.GenericContainerRequest) error {
		if shared() {
			return testcontainers.WithReuseByName("exactly-" + os.Getenv("EXACTLY_TESTENV_RUN") + "-" + service)(req)
		}
		return nil
	}
}

// containerEnv returns the value of the environment variable key in c's
// configuration.
func containerEnv(ctx context.Context, c testcontainers.Container, key string) (string, error) {
	in, err := c.Inspect(ctx)
	if err != nil {
		return "", fmt.Errorf("inspect container: %w", err)
	}
	for _, kv := range in.Config.Env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("container %s has no %s", c.GetContainerID(), key)
}

// runPostgres starts postgresImage on the host network, listening on
// 127.0.0.1 at a free port (PGPORT, which the server and the image's
// entrypoint honour), and waits until it accepts connections.
func runPostgres(ctx context.Context) (testcontainers.Container, string, string, error) {
	return runService(ctx, service{
		image: postgresImage,
		ports: 1,
		options: func(ports []int) []testcontainers.ContainerCustomizer {
			return []testcontainers.ContainerCustomizer{
				testcontainers.WithEnv(map[string]string{
					"POSTGRES_USER":     "postgres",
					"POSTGRES_PASSWORD": "postgres",
					"POSTGRES_DB":       "exactly_test",
					"PGPORT":            strconv.Itoa(ports[0]),
				}),
				testcontainers.WithCmd("postgres", "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200"),
				Loopback(),
				Shared("postgres"),
				// The init server logs the line once, the real server once more.
				testcontainers.WithWaitStrategyAndDeadline(4*time.Minute,
					wait.ForLog("database system is ready to accept connections").WithOccurrence(2).WithStartupTimeout(4*time.Minute)),
			}
		},
		env: "PGPORT",
		address: func(port string) (string, string) {
			return fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%s/exactly_test?sslmode=disable", port), "127.0.0.1:" + port
		},
		ready: pingPostgres,
	})
}

func pingPostgres(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return c.Close(ctx)
}

// runKafka starts kafkaImage on the host network, its listeners on
// 127.0.0.1 at free ports (set through KAFKA_LISTENERS and the other KAFKA_*
// variables, as the official image takes them), configured as
// scripts/kafka/server.properties configures the broker CI runs, and waits
// until it serves.
func runKafka(ctx context.Context) (testcontainers.Container, string, string, error) {
	return runService(ctx, service{
		image: kafkaImage,
		ports: 2,
		options: func(ports []int) []testcontainers.ContainerCustomizer {
			addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
			controller := fmt.Sprintf("127.0.0.1:%d", ports[1])
			return []testcontainers.ContainerCustomizer{
				testcontainers.WithEnv(map[string]string{
					"CLUSTER_ID":                                             "exactly-test-kafka-xw",
					"KAFKA_NODE_ID":                                          "1",
					"KAFKA_PROCESS_ROLES":                                    "broker,controller",
					"KAFKA_LISTENERS":                                        "PLAINTEXT://" + addr + ",CONTROLLER://" + controller,
					"KAFKA_ADVERTISED_LISTENERS":                             "PLAINTEXT://" + addr,
					"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":                   "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
					"KAFKA_CONTROLLER_LISTENER_NAMES":                        "CONTROLLER",
					"KAFKA_INTER_BROKER_LISTENER_NAME":                       "PLAINTEXT",
					"KAFKA_CONTROLLER_QUORUM_VOTERS":                         "1@" + controller,
					"KAFKA_NUM_PARTITIONS":                                   "1",
					"KAFKA_AUTO_CREATE_TOPICS_ENABLE":                        "true",
					"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":                 "1",
					"KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS":                     "10",
					"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR":         "1",
					"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":                    "1",
					"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
					"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR":            "1",
					"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":                 "0",
					"KAFKA_GROUP_CONSUMER_MIN_SESSION_TIMEOUT_MS":            "1000",
					"KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS":                     "1000",
					"KAFKA_GROUP_SHARE_MIN_RECORD_LOCK_DURATION_MS":          "1000",
					"KAFKA_GROUP_SHARE_MIN_SESSION_TIMEOUT_MS":               "1000",
					"KAFKA_GROUP_SHARE_MIN_HEARTBEAT_INTERVAL_MS":            "500",
					"KAFKA_NUM_NETWORK_THREADS":                              "2",
					"KAFKA_NUM_IO_THREADS":                                   "4",
					"KAFKA_HEAP_OPTS":                                        "-Xms256m -Xmx512m",
				}),
				Loopback(),
				Shared("kafka"),
				testcontainers.WithWaitStrategyAndDeadline(5*time.Minute, wait.ForLog("Kafka Server started").WithStartupTimeout(5*time.Minute)),
			}
		},
		// A container shared with other test processes has their port.
		env: "KAFKA_ADVERTISED_LISTENERS",
		address: func(adv string) (string, string) {
			addr := strings.TrimPrefix(adv, "PLAINTEXT://")
			return addr, addr
		},
		ready: kafkaReady,
	})
}

// service is one container of the kit: its image, its options on the free
// ports picked for it, the variable of its environment that holds the
// address it serves on (a container shared with other test processes has
// theirs), what to connect to and say from that value, and the check that
// it serves.
type service struct {
	image   string
	ports   int
	options func(ports []int) []testcontainers.ContainerCustomizer
	env     string
	address func(env string) (addr, where string)
	ready   func(ctx context.Context, addr string) error
}

// runService starts s and waits until it serves. A free port can be taken
// between the pick and the server's bind: it tries again on others.
func runService(ctx context.Context, s service) (testcontainers.Container, string, string, error) {
	var lastErr error
	for range 3 {
		ports, err := testenv.FreePorts(s.ports)
		if err != nil {
			return nil, "", "", err
		}
		c, err := testcontainers.Run(ctx, s.image, s.options(ports)...)
		if err != nil {
			lastErr = err
			if c != nil {
				_ = c.Terminate(context.Background())
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		env, err := containerEnv(ctx, c, s.env)
		if err != nil {
			_ = c.Terminate(context.Background())
			return nil, "", "", err
		}
		addr, where := s.address(env)
		for ctx.Err() == nil {
			if lastErr = s.ready(ctx, addr); lastErr == nil {
				return c, addr, s.image + " at " + where, nil
			}
			if st, err := c.State(ctx); err == nil && !st.Running {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = c.Terminate(context.Background())
	}
	return nil, "", "", fmt.Errorf("%s on the host network: %w", s.image, lastErr)
}

// kafkaReady reports whether the broker at addr serves a topic. A broker
// that has just started answers metadata requests long before its first
// topic creation completes on a loaded machine (the JVM is still cold), so
// kafkaReady creates one (or finds it, on a shared broker), reads its end
// offset and a group's committed offsets, with time to spare, before the
// tests' own 10 s requests go to it.
func kafkaReady(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(addr), Timeout: time.Minute}
	const topic = "exactly-testenv-ready"
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
	}}})
	if err != nil {
		return err
	}
	if err := res.Errors[topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return err
	}
	if _, err := kafkaadmin.EndOffsets(ctx, c, topic, 1); err != nil {
		return err
	}
	// The group coordinator comes up with __consumer_offsets, created on
	// the first group request: have it created now, not in a test's join.
	_, err = kafkaadmin.Committed(ctx, c, "exactly-testenv-ready", topic, 1)
	return err
}
