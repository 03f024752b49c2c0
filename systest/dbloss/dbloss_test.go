package dbloss_test

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/systest/pgcluster"
)

const partitions = 3

// world is the ledgers, the topic they consume and the consumers running.
type world struct {
	t       *testing.T
	brokers []string
	topic   string
	ledgers []ledger
	rnd     *rand.Rand
	stops   []func()
}

func newWorld(t *testing.T) *world {
	requireClusters(t)
	kafkatest.RequireReal(t)
	return &world{t: t, brokers: kafkatest.Brokers(t), topic: kafkatest.Topic(t, partitions), ledgers: ledgers(),
		rnd: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 26))}
}

func (w *world) create(pool *pgxpool.Pool) {
	for _, l := range w.ledgers {
		l.create(w.t, pool)
	}
}

// start runs every ledger's consumer on pool.
func (w *world) start(pool *pgxpool.Pool) {
	for _, l := range w.ledgers {
		w.stops = append(w.stops, l.start(w.t, pool, w.brokers, w.topic))
	}
}

// stop stops every consumer, all at once.
func (w *world) stop() {
	var wg sync.WaitGroup
	for _, s := range w.stops {
		wg.Add(1)
		go func() { defer wg.Done(); s() }()
	}
	wg.Wait()
	w.stops = nil
}

func (w *world) produce(n int) { produce(w.t, w.brokers, w.topic, n, w.rnd) }

// waitCommitted waits for every ledger to commit every record, and stops
// the test if one does not.
func (w *world) waitCommitted(pool *pgxpool.Pool) {
	if !waitCommitted(w.t, pool, w.ledgers, w.topic, partitions, 90*time.Second) {
		w.t.FailNow()
	}
}

// waitFinished waits for every ledger to commit every record after the
// database lost commits; the audit that follows says what a ledger that
// did not has lost.
func (w *world) waitFinished(pool *pgxpool.Pool) {
	waitCommitted(w.t, pool, w.ledgers, w.topic, partitions, 45*time.Second)
}

// entries is the number of entries of each ledger on pool.
func (w *world) entries(pool *pgxpool.Pool) map[string]int {
	out := map[string]int{}
	for _, l := range w.ledgers {
		out[l.schema] = l.entries(w.t, pool)
	}
	return out
}

// audit checks every ledger on pool against the topic, after the database
// lost commits that Kafka's offsets had passed: without positions, commands are lost; with them,
// every command is applied exactly once.
func (w *world) audit(pool *pgxpool.Pool) {
	t := w.t
	records := kafkatest.ReadAll(t, w.topic, partitions, time.Minute)
	for _, l := range w.ledgers {
		lost, doubled, wrong := l.audit(t, pool, records)
		t.Logf("%-30s %d commands, %d lost, %d doubled, %d wrong balances", l.String()+":", len(records), lost, doubled, wrong)
		if l.positions {
			if lost != 0 || doubled != 0 || wrong != 0 {
				t.Errorf("%s: %d commands lost, %d applied twice, %d balances wrong; want none", l, lost, doubled, wrong)
			}
			continue
		}
		// The loss the positions prevent is real.
		if lost == 0 {
			t.Errorf("%s: no command lost: the database lost no commit that Kafka's offsets had passed", l)
		}
		if doubled != 0 {
			t.Errorf("%s: %d commands applied twice", l, doubled)
		}
	}
}

// An asynchronous standby that fell behind is promoted after its primary
// was killed with SIGKILL mid-stream: the commits the standby never
// received are lost, while Kafka's committed offsets had passed them.
func TestAsyncStandbyFailover(t *testing.T) {
	w := newWorld(t)
	base := pgcluster.BaseDir(t)
	primary := newPrimary(t, base, "primary")
	ppool := pool(t, primary, "dbloss")
	w.create(ppool)
	standby := backup(t, primary, base, "standby", true)
	must(t, standby.Start())
	spool := pool(t, standby, "dbloss")

	w.start(ppool)
	w.produce(100)
	w.waitCommitted(ppool)
	flushed := lsn(t, ppool, "pg_current_wal_flush_lsn()")
	testenv.WaitFor(t, time.Minute, "the standby to replay what the primary flushed", func() bool {
		return !lsnAhead(t, spool, flushed, lsn(t, spool, "pg_last_wal_replay_lsn()"))
	})

	// From here the standby receives nothing; the primary goes on
	// committing, and Kafka's offsets go past what the standby has.
	must(t, primary.StopWALSenders())
	w.produce(200)
	w.waitCommitted(ppool)
	w.produce(60)
	before := w.entries(ppool)
	flushed = lsn(t, ppool, "pg_current_wal_flush_lsn()")
	must(t, primary.Kill9()) // mid-stream: the last 60 commands are being consumed
	replayed := lsn(t, spool, "pg_last_wal_replay_lsn()")
	if !lsnAhead(t, spool, flushed, replayed) {
		t.Fatalf("the primary's flushed LSN %s is not ahead of the standby's replay LSN %s: no commit was lost", flushed, replayed)
	}
	t.Logf("killed the primary at flushed LSN %s; the standby replayed up to %s", flushed, replayed)
	w.stop()

	must(t, standby.Promote())
	after := w.entries(spool)
	for _, l := range w.ledgers {
		if after[l.schema] >= before[l.schema] {
			t.Fatalf("%s: %d entries on the promoted standby, %d on the primary before the kill: nothing lost", l, after[l.schema], before[l.schema])
		}
	}
	w.start(spool)
	w.waitFinished(spool)
	w.stop()
	w.audit(spool)
}

// A base backup taken mid-stream is restored after the origin died, while
// Kafka's committed offsets are ahead of it: the commits after the backup's
// end are lost.
func TestRestoreBaseBackup(t *testing.T) {
	w := newWorld(t)
	base := pgcluster.BaseDir(t)
	origin := newPrimary(t, base, "origin")
	opool := pool(t, origin, "dbloss")
	w.create(opool)

	w.start(opool)
	w.produce(100)
	w.waitCommitted(opool)
	// The backup runs while commands are being consumed.
	produced := make(chan struct{})
	go func() { defer close(produced); w.produce(200) }()
	restored := backup(t, origin, base, "restored", false)
	<-produced
	w.produce(100)
	w.waitCommitted(opool)
	w.produce(60)
	before := w.entries(opool)
	must(t, origin.Kill9()) // mid-stream: the last 60 commands are being consumed
	w.stop()

	must(t, restored.Start())
	rpool := pool(t, restored, "dbloss")
	after := w.entries(rpool)
	for _, l := range w.ledgers {
		if after[l.schema] >= before[l.schema] {
			t.Fatalf("%s: %d entries restored, %d on the origin before the kill: nothing lost", l, after[l.schema], before[l.schema])
		}
	}
	w.start(rpool)
	w.waitFinished(rpool)
	w.stop()
	w.audit(rpool)
}
