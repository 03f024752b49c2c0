package replaycli

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/redact"
	"github.com/exactly-go/exactly/internal/sqlident"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// PositionsConfig configures Positions.
type PositionsConfig struct {
	Brokers []string
	// Security holds the TLS and SASL settings. Defaults to plain TCP.
	Security    kafkapubsub.Security
	Group       string
	Topic       string
	DatabaseURL string
	// Schema and Table locate the positions table. Default to the database
	// URL's search_path (else public) and exactly_positions.
	Schema, Table string
}

// PartitionPosition is one partition's offsets: Kafka's committed offset,
// the database's position (-1 for none) and the log's bounds.
type PartitionPosition struct {
	Partition int   `json:"partition"`
	Kafka     int64 `json:"kafka_committed"`
	Database  int64 `json:"database_position"`
	// Gap is Kafka's committed offset minus the database's position when
	// both exist: above 0, the database is behind (it lost commits, or was
	// restored) and the consumer delivers that many records again at its
	// next assignment; below 0, the last commit to Kafka did not happen.
	Gap      int64 `json:"gap"`
	LogStart int64 `json:"log_start"`
	LogEnd   int64 `json:"log_end"`
	// Unrecoverable is set when the database's position is below the log
	// start: records the database may have lost are no longer in Kafka.
	Unrecoverable bool `json:"unrecoverable,omitempty"`
}

// PositionsReport compares a group's offsets in Kafka and in the database.
type PositionsReport struct {
	Group      string              `json:"group"`
	Topic      string              `json:"topic"`
	Partitions []PartitionPosition `json:"partitions"`
	// Behind sums the positive gaps: the records delivered again.
	Behind int64 `json:"behind"`
}

// Positions reports, per partition of the topic, the group's committed
// offset in Kafka, its position in the database (pgstore.Positions) and
// the gap between them.
func Positions(ctx context.Context, o PositionsConfig) (PositionsReport, error) {
	rep := PositionsReport{Group: o.Group, Topic: o.Topic}
	if o.Group == "" || o.Topic == "" || o.DatabaseURL == "" {
		return rep, fmt.Errorf("%w: --group, --topic and --database-url (or DATABASE_URL) are required", errUsage)
	}
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return rep, fmt.Errorf("%w at %s: %v", errDatabase, Redact(o.DatabaseURL), redact.Error(err, o.DatabaseURL))
	}
	defer pool.Close()
	if o.Schema == "" {
		o.Schema = sqlident.DefaultSchema(pool.Config().ConnConfig)
	}
	positions, err := pgstore.NewPositions(pool, &pgstore.PositionsConfig{Schema: o.Schema, Table: o.Table})
	if err != nil {
		return rep, fmt.Errorf("%w: %v", errUsage, err)
	}
	k := newKafka(o.Brokers, o.Security)
	n, err := k.partitions(ctx, o.Topic)
	if err != nil {
		return rep, err
	}
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	committed, err := k.committed(ctx, o.Group, o.Topic, n)
	if err != nil {
		return rep, err
	}
	first, err := k.listFirst(ctx, o.Topic, parts)
	if err != nil {
		return rep, err
	}
	last, err := k.offsets(ctx, o.Topic, parts, kafka.LastOffsetOf)
	if err != nil {
		return rep, err
	}
	stored, err := positions.Load(ctx, o.Group, o.Topic, parts)
	if err != nil {
		return rep, fmt.Errorf("%w: %v", errDatabase, redact.Error(err, o.DatabaseURL))
	}
	for _, p := range parts {
		pp := PartitionPosition{Partition: p, Kafka: -1, Database: -1, LogStart: first[p], LogEnd: last[p]}
		if c, ok := committed[p]; ok && c >= 0 {
			pp.Kafka = c
		}
		if s, ok := stored[p]; ok {
			pp.Database = s
			pp.Unrecoverable = s < pp.LogStart && (pp.Kafka < 0 || s < pp.Kafka)
		}
		if pp.Kafka >= 0 && pp.Database >= 0 {
			pp.Gap = pp.Kafka - pp.Database
			rep.Behind += max(pp.Gap, 0)
		}
		rep.Partitions = append(rep.Partitions, pp)
	}
	return rep, nil
}
