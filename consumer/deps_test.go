package consumer_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLayering keeps the middleware free of any Kafka client and beside the
// Postgres store (neither imports the other: both sit on dedupe), and the
// Kafka transport free of Postgres: a user of another Pub/Sub does not
// compile kafka-go, a user of the Subscriber alone does not compile pgx.
func TestLayering(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	for pkg, banned := range map[string][]string{
		".":              {"github.com/segmentio/kafka-go", "github.com/exactly-go/exactly/kafkapubsub", "github.com/exactly-go/exactly/worker", "github.com/exactly-go/exactly/pgstore", "github.com/IBM/sarama", "github.com/twmb/franz-go"},
		"../pgstore":     {"github.com/exactly-go/exactly/consumer", "github.com/exactly-go/exactly/kafkapubsub", "github.com/exactly-go/exactly/worker", "github.com/segmentio/kafka-go", "github.com/ThreeDotsLabs/watermill"},
		"../kafkapubsub": {"github.com/jackc/pgx", "github.com/exactly-go/exactly/consumer", "github.com/exactly-go/exactly/pgstore", "github.com/exactly-go/exactly/worker"},
	} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range banned {
				if dep == b || strings.HasPrefix(dep, b+"/") {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}
