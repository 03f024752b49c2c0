package ledgertest_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/exactly-go/exactly/cmd/replay/internal/replaycli"
	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kgopubsub"
)

// The replay tool on the groups of the franz-go transport, cooperative
// and KIP-848: rewind refuses while the worker runs and moves the offsets
// once it stopped; verify redelivers the topic and finds nothing applied
// twice. On Kafka 3.x (the version matrix's KAFKA_VERSION) the KIP-848
// case is skipped: franz-go falls back to the classic protocol there, which
// the classic case already runs.
func TestReplayOnFranzGo(t *testing.T) {
	t.Parallel()
	for _, proto := range []kgopubsub.GroupProtocol{kgopubsub.ProtocolClassic, kgopubsub.ProtocolConsumer} {
		t.Run(string(proto), func(t *testing.T) {
			t.Parallel()
			if v := os.Getenv("KAFKA_VERSION"); proto == kgopubsub.ProtocolConsumer && v != "" && v < "4" {
				t.Skipf("Kafka %s: the KIP-848 consumer group protocol is generally available from Kafka 4.0", v)
			}
			lw := newLedgerWith(t, func(c *ledger.Config) { c.Transport = kgopubsub.Transport{GroupProtocol: proto} })
			code, rep, errs := lw.verify(t, "--duplicate", "2")
			if code != replaycli.ExitOK || !rep.Pass || rep.ReApplied != 0 || rep.StateChanged || rep.Deduplicated == 0 {
				t.Fatalf("verify: exit %d, %+v\n%s", code, rep, errs)
			}
			base := []string{"rewind", "--brokers", lw.brokers[0], "--group", lw.group, "--topic", lw.commands, "--back", "5"}
			if code, _, errs := run(base...); code != replaycli.ExitGroupActive {
				t.Fatalf("rewind of an active group: exit %d\n%s", code, errs)
			}
			if code, _, errs := run(append(base, "--execute")...); code != replaycli.ExitGroupActive {
				t.Fatalf("rewind --execute of an active group: exit %d\n%s", code, errs)
			}
			lw.stop()
			before := kafkatest.CommittedOffsets(t, lw.group, lw.commands, 3)
			if code, out, errs := run(append(base, "--execute")...); code != replaycli.ExitOK {
				t.Fatalf("execute: exit %d\n%s%s", code, out, errs)
			}
			after := kafkatest.CommittedOffsets(t, lw.group, lw.commands, 3)
			for p, o := range before {
				if after[p] != max(o-5, 0) {
					t.Fatalf("partition %d: %d -> %d, want back by 5 (%s)", p, o, after[p], fmt.Sprint(after))
				}
			}
		})
	}
}
