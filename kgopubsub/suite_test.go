package kgopubsub_test

import (
	"testing"

	"github.com/exactly-go/exactly/internal/testkit/subtest"
	"github.com/exactly-go/exactly/kgopubsub"
)

func TestMain(m *testing.M) { subtest.Main(m, kgopubsub.Transport{}) }

// The subscriber contract suite (internal/testkit/subtest), which
// kafkapubsub's Subscriber passes too, through the Transport a worker
// takes.
func TestSubscriberContract(t *testing.T) { subtest.Run(t, kgopubsub.Transport{}) }
