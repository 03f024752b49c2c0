package retry_test

import (
	"testing"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
