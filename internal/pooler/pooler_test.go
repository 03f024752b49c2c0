package pooler_test

import (
	"context"
	"testing"

	"github.com/exactly-go/exactly/internal/pooler"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

func TestDetectDirect(t *testing.T) {
	info, err := pooler.Detect(context.Background(), pgtest.Pool(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.Pooler || info.Transaction {
		t.Fatalf("a direct connection: %+v", info)
	}
}

func TestDetectPooler(t *testing.T) {
	info, err := pooler.Detect(context.Background(), pgtest.PoolerPool(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	want := pooler.Info{Pooler: true, Transaction: true} // session mode cannot be told from transaction mode
	if info != want {
		t.Fatalf("behind PgBouncer in %s mode: %+v, want %+v", pgtest.PoolerMode(), info, want)
	}
}
