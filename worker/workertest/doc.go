// Package workertest runs a worker end to end in a test: a Postgres schema
// and Kafka topics of the test's own, the worker on the user's handler,
// commands sent with exact duplicates, redeliveries and a replay of the
// topic, a wait until the worker has caught up, and assertions that each
// command was applied once — on the user's rows, the outputs topic and the
// dead-letter topic.
//
// A whole test of a worker, whose handler topUp is the README's quick
// start's (example_test.go runs it):
//
//	func TestTopUps(t *testing.T) {
//		t.Parallel()
//		k := workertest.New(t, &workertest.Config{
//			Setup: []string{"CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)"},
//		})
//		k.Start(&worker.Config{Scope: "top-ups", Handler: topUp})
//		a := workertest.Command{ID: "cmd-1", Payload: `{"account":"acc-1","amount":10}`}
//		b := workertest.Command{ID: "cmd-2", Payload: `{"account":"acc-2","amount":20}`}
//		c := workertest.Command{ID: "cmd-3", Payload: `{"account":"acc-1","amount":5}`}
//		bad := workertest.Command{ID: "cmd-4", Payload: `{"amount":`}
//		k.Send(a, a, b, c, bad) // a twice: an exact duplicate, as a producer's retry leaves
//		k.Redeliver("cmd-2")    // cmd-2 again, later
//		k.Replay()              // a new group consumes the whole topic again
//		k.AssertRows("SELECT id, balance FROM accounts ORDER BY id", "acc-1 15", "acc-2 20")
//		k.AssertOutputs("topped-up-cmd-1", "topped-up-cmd-2", "topped-up-cmd-3")
//		k.AssertDeadLetters("cmd-4", "cmd-4") // refused for good on each pass over the topic
//	}
//
// The assertions wait until the worker has caught up
// ([Kit.WaitCaughtUp]: Kafka's committed offsets and the positions in
// Postgres at the topic's end, the outbox published), then report each
// difference with t.Errorf.
//
// The servers are the user's when the environment names them
// (TEST_DATABASE_URL, TEST_KAFKA_BROKERS, or Config.DatabaseURL and
// Config.Brokers), else a throwaway PostgreSQL (package embedpg: the
// machine's binaries, or binaries fetched once from Maven Central) and an
// in-process Kafka broker (franz-go's kfake), each started once per test
// binary and shared by its tests. Each [Kit] gets a schema of its own,
// migrated, with the pool's search_path set to it, and topics and consumer
// groups of its own, all removed when the test ends, so tests run in
// parallel on one server and one broker.
//
// "Applied once" is the user's rows' to say: [Kit.AssertAppliedOnce] takes
// a query returning a row per application, the command's ID first (a
// journal, an entries table), and [Kit.AssertRows] the state itself (a
// balance counted twice shows). A handler that writes outside its
// transaction (on the pool, to a service) applies again each time its
// transaction is retried; both assertions catch that where the plain
// key table cannot.
//
// [Kit.Start] runs a worker.Worker made from a worker.Config; [Kit.Run]
// runs the user's own program instead (a constructor of their own, a
// main's run function) on the kit's servers and topics. Either way the
// worker stops when the test ends, and an error from it fails the test.
//
// The package is a module of its own (github.com/exactly-go/exactly/worker/workertest):
// a program that imports the library never compiles embedpg or kfake.
package workertest
