package ledger

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/kafkapubsub"
)

// The worker's Kafka flags: nothing set is plain TCP without SASL and the
// default partitioner; each half-given setting is refused with the flag to
// fix; SASL takes its password from $KAFKA_SASL_PASSWORD only.
func TestKafkaConnFlags(t *testing.T) {
	for _, env := range []string{"KAFKA_TLS", "KAFKA_TLS_CA", "KAFKA_TLS_CERT", "KAFKA_TLS_KEY", "KAFKA_SASL_MECHANISM", "KAFKA_SASL_USER", "KAFKA_PARTITIONER"} {
		t.Setenv(env, "")
	}
	t.Setenv("KAFKA_SASL_PASSWORD", "pw")
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) (kafkapubsub.Security, kafkapubsub.Partitioner, error) {
		t.Helper()
		var k kafkaConn
		fs := flag.NewFlagSet("worker", flag.ContinueOnError)
		k.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return k.settings()
	}
	sec, part, err := parse()
	if err != nil || sec.TLS != nil || sec.SASL != nil || part != kafkapubsub.PartitionerMurmur2 {
		t.Fatalf("no flags: %+v %q %v; want plain TCP, no SASL, murmur2", sec, part, err)
	}
	sec, part, err = parse("--kafka-tls", "--kafka-sasl", "SCRAM-SHA-512", "--kafka-sasl-user", "alice", "--partitioner", "fnv1a")
	if err != nil || sec.TLS == nil || sec.SASL == nil || sec.SASL.Name() != "SCRAM-SHA-512" || part != kafkapubsub.PartitionerFNV1a {
		t.Fatalf("TLS, SCRAM, fnv1a: %+v %q %v", sec, part, err)
	}
	if sec, _, err = parse("--kafka-sasl", "plain", "--kafka-sasl-user", "alice"); err != nil || sec.SASL == nil || sec.SASL.Name() != "PLAIN" {
		t.Fatalf("plain: %+v %v", sec, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kafka-sasl-user", "alice"}, "--kafka-sasl is not"},
		{[]string{"--kafka-sasl", "plain"}, "needs --kafka-sasl-user"},
		{[]string{"--kafka-sasl", "gssapi", "--kafka-sasl-user", "alice"}, "use plain, scram-sha-256 or scram-sha-512"},
		{[]string{"--kafka-tls-cert", "c.pem"}, "go together"},
		{[]string{"--kafka-tls-ca", notPEM}, "no PEM certificate"},
		{[]string{"--kafka-tls-ca", filepath.Join(t.TempDir(), "missing.pem")}, "--kafka-tls-ca"},
		{[]string{"--partitioner", "random"}, "--partitioner"},
	} {
		if _, _, err := parse(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want one that says %q", c.args, err, c.want)
		}
	}
	t.Setenv("KAFKA_SASL_PASSWORD", "")
	if _, _, err := parse("--kafka-sasl", "plain", "--kafka-sasl-user", "alice"); err == nil || !strings.Contains(err.Error(), "$KAFKA_SASL_PASSWORD") {
		t.Errorf("no password: err = %v", err)
	}
}
