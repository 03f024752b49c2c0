package workertest_test

import (
	"testing"

	"github.com/exactly-go/exactly/worker/workertest"
)

func TestMain(m *testing.M) { workertest.Main(m) }
