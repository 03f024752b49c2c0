package kafkaflags

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSecurityFromFlags(t *testing.T) {
	t.Setenv("KAFKA_SASL_PASSWORD", "pw")
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		err  string // "" for none
	}{
		{nil, ""},
		{[]string{"--kafka-sasl", "plain", "--kafka-sasl-user", "alice"}, ""},
		{[]string{"--kafka-sasl", "SCRAM-SHA-512", "--kafka-sasl-user", "alice", "--kafka-tls"}, ""},
		{[]string{"--kafka-sasl", "plain"}, "--kafka-sasl-user"},
		{[]string{"--kafka-sasl-user", "alice"}, "--kafka-sasl is not"},
		{[]string{"--kafka-sasl", "gssapi", "--kafka-sasl-user", "alice"}, "use plain, scram-sha-256 or scram-sha-512"},
		{[]string{"--kafka-tls-cert", "c.pem"}, "go together"},
		{[]string{"--kafka-tls-ca", ca}, "no PEM certificate"},
		{[]string{"--kafka-tls-ca", ca + ".missing"}, "--kafka-tls-ca"},
		{[]string{"--partitioner", "murmur3"}, "--partitioner"},
	} {
		var f Flags
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		f.Register(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		sec, err := f.Security()
		if err == nil {
			_, err = f.PublisherPartitioner()
		}
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.err)
		case tc.err == "" && len(tc.args) > 0 && sec.SASL == nil:
			t.Errorf("%v: no SASL mechanism", tc.args)
		}
	}
	t.Setenv("KAFKA_SASL_PASSWORD", "")
	f := Flags{SASLMechanism: "plain", SASLUser: "alice"}
	if _, err := f.Security(); err == nil || !strings.Contains(err.Error(), "KAFKA_SASL_PASSWORD") {
		t.Errorf("no password: %v", err)
	}
}
